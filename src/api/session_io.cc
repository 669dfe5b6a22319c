// The interactive data-plane routes of a session (stdin, stdin:close, signal, resize) and the
// sandbox's process list: short agent calls, never blocking an io thread.
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/status_to_http.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;

http::Response NoContent() {
  http::Response res{bhttp::status::no_content, 11};
  res.set(bhttp::field::cache_control, "no-store");
  return res;
}

bool IsJsonContentType(const http::Request& req) {
  auto it = req.find(bhttp::field::content_type);
  if (it == req.end()) return false;
  std::string_view v(it->value().data(), it->value().size());
  v = v.substr(0, v.find(';'));
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v.size() == 16 && strncasecmp(v.data(), "application/json", 16) == 0;
}

// What an agent error means for this session, in the API's words. The agent knows only its
// own view: "not_found" is a session whose process was never started (no attach yet).
absl::Status ForClient(const absl::Status& s, const std::string& session_id,
                       std::string_view action) {
  const std::string code = ApiErrorCode(s);
  const std::string msg = std::string(s.message());
  if (code == "not_found") {
    return ApiError(absl::StatusCode::kFailedPrecondition, "session_not_started",
                    fmt::format("session {} has not started: its process starts at the first "
                                "attach (GET /v1/sessions/{}/attach or /ws)",
                                session_id, session_id));
  }
  if (code == "resource_exhausted") {
    return ApiError(absl::StatusCode::kResourceExhausted, "stdin_buffer_full",
                    fmt::format("{}: {}; retry once the process has read some", action, msg));
  }
  if (code == "failed_precondition") {
    const bool exited = msg.find("has exited") != std::string::npos;
    return ApiError(absl::StatusCode::kFailedPrecondition,
                    exited ? "session_exited" : "invalid_state",
                    fmt::format("{}: {}", action, msg));
  }
  return Annotate(s, fmt::format("{} {}", action, session_id));
}


// The agent call an action stands for, once the body has been checked.
struct IoCall {
  std::string action;
  std::string data;  // stdin
  int signal = 0;
  int rows = 0, cols = 0;
};

absl::StatusOr<IoCall> ParseIoBody(const http::Request& req, const std::string& action) {
  IoCall call{action};
  if (action == "stdin") {
    SBX_ASSIGN_OR_RETURN(call.data, ParseStdinBody(req.body(), IsJsonContentType(req)));
  } else if (action == "stdin:close") {
    if (!req.body().empty()) SBX_RETURN_IF_ERROR(ParseLifecycleBody(req.body()));
  } else if (action == "signal") {
    SBX_ASSIGN_OR_RETURN(call.signal, ParseSignalBody(req.body()));
  } else {  // resize
    SBX_ASSIGN_OR_RETURN(auto size, ParseResizeBody(req.body()));
    call.rows = size.first;
    call.cols = size.second;
  }
  return call;
}

http::asio::awaitable<absl::Status> CallAgent(http::RequestContext& ctx, service::AgentClient& agent,
                                              const std::string& session_id, const IoCall& c) {
  if (c.action == "stdin") {
    co_return (co_await agent.Stdin(ctx.executor, session_id, c.data)).status();
  }
  if (c.action == "stdin:close") {
    co_return (co_await agent.StdinClose(ctx.executor, session_id)).status();
  }
  if (c.action == "signal") co_return co_await agent.Signal(ctx.executor, session_id, c.signal);
  co_return co_await agent.Resize(ctx.executor, session_id, static_cast<uint16_t>(c.rows),
                                  static_cast<uint16_t>(c.cols));
}

}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::SessionIo(
    http::RequestContext& ctx, const service::Caller& caller, const std::string& session_id,
    const std::string& action) {
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };
  if (ctx.req.method() != bhttp::verb::post) {
    co_return fail(MethodNotAllowed(ctx.req, "POST"));
  }
  // The body first: a malformed request is a 400 whatever the session's state.
  auto call = ParseIoBody(ctx.req, action);
  if (!call.ok()) co_return fail(call.status());

  auto target = log::With(ctx.log, [&] { return svc_.PrepareAttach(caller, session_id); });
  if (!target.ok()) co_return fail(target.status());
  ctx.log.sandbox = target->session.sandbox_id;
  if ((action == "stdin" || action == "stdin:close") && !target->spec.stdin_pipe) {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "stdin_not_enabled",
                            fmt::format("session {} was created without \"stdin\": true",
                                        session_id)));
  }
  if (action == "resize" && !target->spec.tty) {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "not_a_tty",
                            fmt::format("session {} was created without \"tty\"", session_id)));
  }
  if (target->session.state == "exited") {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "session_exited",
                            fmt::format("session {} has exited", session_id)));
  }
  absl::Status r = co_await CallAgent(ctx, target->agent, session_id, *call);
  if (!r.ok()) co_return fail(ForClient(r, session_id, action));
  // Input counts as activity on the sandbox, like an attached client.
  if (caller.initiator == "api") svc_.activity().Touch(target->session.sandbox_id);
  co_return NoContent();
}

http::asio::awaitable<std::optional<http::Response>> Api::Processes(
    http::RequestContext& ctx, const service::Caller& caller, const std::string& sandbox_id) {
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };
  if (ctx.req.method() != bhttp::verb::get) {
    co_return fail(MethodNotAllowed(ctx.req, "GET"));
  }
  auto agent = log::With(ctx.log, [&] { return svc_.SandboxAgent(caller, sandbox_id); });
  if (!agent.ok()) co_return fail(agent.status());
  // The sandbox id is one of ours ([a-z0-9_]): its JSON string needs no escaping.
  std::string head = fmt::format("{{\"sandbox_id\":\"{}\",", sandbox_id);
  // Named values, not temporaries, across co_await (GCC 12 coroutine frames).
  GuestSizedFetch fetch = [&, agent = std::move(*agent), head = std::move(head)]() mutable {
    return agent.ProcessesBody(ctx.executor, head);
  };
  co_return co_await GuestSizedReply(ctx, sandbox_id, std::move(fetch));
}

}  // namespace sbx::api
