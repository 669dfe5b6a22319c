// The interactive data-plane routes of a session (stdin, stdin:close, signal, resize) and the
// sandbox's process list: short agent calls, never blocking an io thread.
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/status_to_http.h"
#include "common/base64.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_stream.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;

constexpr std::chrono::milliseconds kAgentCallTimeout{5000};

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


}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::SessionIo(
    http::RequestContext& ctx, const service::Caller& caller, const std::string& session_id,
    const std::string& action) {
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };
  if (ctx.req.method() != bhttp::verb::post) {
    co_return fail(MethodNotAllowed(ctx.req));
  }
  // The body first: a malformed request is a 400 whatever the session's state.
  json request = {{"session_id", session_id}};
  if (action == "stdin") {
    auto data = ParseStdinBody(ctx.req.body(), IsJsonContentType(ctx.req));
    if (!data.ok()) co_return fail(data.status());
    request["op"] = "stdin";
    request["data_b64"] = Base64Encode(*data);
  } else if (action == "stdin:close") {
    if (!ctx.req.body().empty()) {
      if (auto b = ParseLifecycleBody(ctx.req.body()); !b.ok()) co_return fail(b);
    }
    request["op"] = "stdin_close";
  } else if (action == "signal") {
    auto sig = ParseSignalBody(ctx.req.body());
    if (!sig.ok()) co_return fail(sig.status());
    request["op"] = "signal";
    request["signal"] = *sig;
  } else {  // resize
    auto size = ParseResizeBody(ctx.req.body());
    if (!size.ok()) co_return fail(size.status());
    request["op"] = "resize";
    request["rows"] = size->first;
    request["cols"] = size->second;
  }

  auto target = log::With(ctx.log, [&] { return svc_.PrepareAttach(caller, session_id); });
  if (!target.ok()) co_return fail(target.status());
  ctx.log.sandbox = target->session.sandbox_id;
  const json& spec = target->session.spec;
  if ((action == "stdin" || action == "stdin:close") && !spec.value("stdin", false)) {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "stdin_not_enabled",
                            fmt::format("session {} was created without \"stdin\": true",
                                        session_id)));
  }
  if (action == "resize" && !spec.contains("tty")) {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "not_a_tty",
                            fmt::format("session {} was created without \"tty\"", session_id)));
  }
  if (target->session.state == "exited") {
    co_return fail(ApiError(absl::StatusCode::kFailedPrecondition, "session_exited",
                            fmt::format("session {} has exited", session_id)));
  }
  auto r = co_await service::AsyncCallAgent(ctx.executor, target->agent_socket,
                                            std::move(request), kAgentCallTimeout);
  if (!r.ok()) co_return fail(ForClient(r.status(), session_id, action));
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
    co_return fail(MethodNotAllowed(ctx.req));
  }
  auto sock = log::With(ctx.log, [&] { return svc_.SandboxAgentSocket(caller, sandbox_id); });
  if (!sock.ok()) co_return fail(sock.status());
  // Named values, not braced temporaries, around co_await: GCC 12 cannot keep an
  // initializer_list's array in a coroutine frame ("array used as initializer").
  json request = json::object();
  request["op"] = "processes";
  std::string head = "{\"sandbox_id\":";
  protocol::AppendJsonString(head, sandbox_id);
  head.push_back(',');
  co_return co_await GuestSizedReply(ctx, sandbox_id, *sock, std::move(request),
                                     protocol::ProcessesReplySchema(), std::move(head));
}

}  // namespace sbx::api
