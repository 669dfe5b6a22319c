#include "api/api.h"
#include "api/handler_util.h"

#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/attach_events.h"
#include "api/status_to_http.h"
#include "api/target.h"
#include "common/digest.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"
#include "service/views.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;
using Awaitable = http::asio::awaitable<std::optional<http::Response>>;

// Upper bound of one attach write; an event is never split, so a batch may exceed it by one.
constexpr size_t kMaxAttachBatchBytes = 1 << 20;

std::optional<std::string> Header(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

// At least the size of the SSE event a frame becomes (see AppendAttachEvent).
size_t SseSizeBound(const service::AttachFrame& f) {
  if (f.is_output()) return SseOutputEventSizeBound(f.payload_size());
  return f.payload_size() + 256;  // small JSON re-encoded with a few more keys at most
}

metrics::Family<metrics::Counter>& StreamedBytes(metrics::Registry& registry) {
  return registry.AddCounter("sbx_streamed_bytes_total",
                             "Session output delivered to clients over attach streams, in bytes "
                             "of process output (before base64 and SSE framing).",
                             {"stream"});
}

json ExitJson(const service::SessionExit& ev) {
  return {{"exit_code", ev.exit_code ? json(*ev.exit_code) : json(nullptr)},
          {"signal", ev.signal ? json(*ev.signal) : json(nullptr)},
          {"timed_out", ev.timed_out},
          {"oom_killed", ev.oom_killed}};
}

}  // namespace

absl::Status MethodNotAllowed(const http::Request& req) {
  return ApiError(absl::StatusCode::kInvalidArgument, "method_not_allowed",
                  fmt::format("method {} is not allowed on {}", std::string(req.method_string()),
                              std::string(req.target())));
}

// The error response for `s`. A 500 is a bug or a broken host, which only the log can explain
// to an operator (the client sees "internal"); the other errors are the client's business and
// the access-log line records their status.
http::Response Fail(const http::RequestContext& ctx, const absl::Status& s) {
  http::Response res = ErrorResponse(s, ctx.request_id);
  if (res.result() == bhttp::status::internal_server_error) {
    SBX_LOG_ERROR(ctx.log, "internal error: {}", std::string(s.message()));
  } else if (res.result() == bhttp::status::bad_gateway) {
    // An agent that breaks the protocol's bounds is broken or compromised by its guest.
    SBX_LOG_ERROR(ctx.log, "agent reply refused: {}", std::string(s.message()));
  }
  return res;
}

Api::Api(service::SandboxService& svc, ApiOptions opts)
    : svc_(svc),
      opts_(std::move(opts)),
      admin_token_hash_(Sha256Hex(opts_.admin_token)),
      registry_(opts_.metrics != nullptr ? *opts_.metrics : metrics::Default()),
      attach_streams_(registry_
                          .AddGauge("sbx_attach_streams_active",
                                    "Attach (SSE) streams open to clients.")
                          .WithLabels()),
      streamed_stdout_(StreamedBytes(registry_).WithLabels({"stdout"})),
      streamed_stderr_(StreamedBytes(registry_).WithLabels({"stderr"})) {}

void Api::SetLimits(const ResourceLimits& limits) {
  std::lock_guard lock(limits_mu_);
  opts_.limits = limits;
}

ResourceLimits Api::limits() const {
  std::lock_guard lock(limits_mu_);
  return opts_.limits;
}

absl::StatusOr<service::Caller> Api::Authenticate(const http::Request& req,
                                                  const std::optional<std::string>& query_token,
                                                  bool allow_attach_token) const {
  std::optional<std::string> token;
  if (auto auth = Header(req, "Authorization")) {
    constexpr std::string_view kBearer = "Bearer ";
    if (auth->size() > kBearer.size() &&
        strncasecmp(auth->c_str(), kBearer.data(), kBearer.size()) == 0) {
      token = auth->substr(kBearer.size());
    }
  }
  if (!token && allow_attach_token && query_token) token = query_token;
  if (!token) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    "missing bearer token (Authorization: Bearer <token>)");
  }
  if (allow_attach_token && token->rfind("sat1.", 0) == 0) {
    SBX_ASSIGN_OR_RETURN(auto claims, svc_.attach_tokens().Verify(*token));
    return service::Caller{claims.tenant_id, claims.session_id};
  }
  // Hashing first makes the comparison length-independent as well as constant-time.
  if (!ConstantTimeEquals(Sha256Hex(*token), admin_token_hash_)) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated", "invalid token");
  }
  return service::Caller{"default", std::nullopt};
}

bool Api::Privileged(const http::Request& req) const {
  if (auto t = ParseTarget(req.target()); t.ok() && t->segments.size() == 1 &&
                                          (t->segments[0] == "healthz" ||
                                           t->segments[0] == "readyz")) {
    return true;
  }
  return Authenticate(req, std::nullopt, /*allow_attach_token=*/false).ok();
}

// The access-log line is the server's (http/server.cc), with what Route (routes.cc) added to
// ctx.log.
Awaitable Api::Handle(http::RequestContext& ctx) { return Route(ctx); }

http::asio::awaitable<absl::StatusOr<store::OperationRecord>> Api::WaitForOperation(
    http::RequestContext& ctx, const service::Caller& caller, const std::string& id,
    std::chrono::milliseconds wait) {
  namespace asio = http::asio;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto& waiters = svc_.job_waiters();
  for (;;) {
    auto op = svc_.GetOperation(caller, id);
    if (!op.ok() || op->state == "succeeded" || op->state == "failed" ||
        std::chrono::steady_clock::now() >= deadline) {
      co_return op;
    }
    // The timer lives on this connection's strand; the wake-up arrives on a worker thread.
    auto timer = std::make_shared<asio::steady_timer>(ctx.executor, deadline);
    const uint64_t handle = waiters.Add(op->sandbox_id, [timer, ex = ctx.executor] {
      asio::post(ex, [timer] { timer->cancel(); });
    });
    // Re-read once registered: a job that finished between the first read and the
    // registration woke nobody.
    op = svc_.GetOperation(caller, id);
    if (!op.ok() || op->state == "succeeded" || op->state == "failed") {
      waiters.Remove(handle);
      co_return op;
    }
    boost::system::error_code ec;
    co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    waiters.Remove(handle);
  }
}

Awaitable Api::Attach(http::RequestContext& ctx, const service::Caller& caller,
                      const std::string& session_id, const Target& t) {
  const std::string& rid = ctx.request_id;
  auto target = log::With(ctx.log, [&] { return svc_.PrepareAttach(caller, session_id); });
  if (!target.ok()) co_return Fail(ctx, target.status());
  ctx.log.sandbox = target->session.sandbox_id;
  // An attached client keeps the sandbox from being suspended for idleness.
  auto awake = svc_.activity().StreamOpened(target->session.sandbox_id);

  uint64_t after = 0;
  std::optional<std::string> last = Header(ctx.req, "Last-Event-ID");
  if (!last) last = t.Query("last_event_id");
  if (last) {
    auto v = ParseLastEventId(*last);
    if (!v.ok()) co_return Fail(ctx, v.status());
    after = *v;
  }
  auto stream = co_await target->agent.Attach(ctx.executor, session_id, after, target->spec);
  if (!stream.ok()) {
    co_return Fail(ctx, Annotate(stream.status(), fmt::format("attach {}", session_id)));
  }
  log::With(ctx.log, [&] { svc_.RecordSessionStarted(session_id, stream->started()); });

  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(ctx.req.version());
  header.set(bhttp::field::content_type, "text/event-stream");
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Accel-Buffering", "no");
  header.set("X-Request-Id", rid);
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await ctx.stream.Begin(std::move(header))) co_return std::nullopt;
  attach_streams_.Inc();
  struct OpenStream {
    metrics::Gauge& gauge;
    ~OpenStream() { gauge.Dec(); }
  } open_stream{attach_streams_};

  for (;;) {
    auto frame = co_await stream->Next(opts_.keepalive_interval);
    if (!frame.ok()) {
      // The agent went away before the exit event: the sandbox was deleted, or its agent died.
      const json err = co_await AgentGoneError(ctx, target->session.sandbox_id, frame.status());
      co_await ctx.stream.Write(SseEvent(0, "error", err.dump()));
      break;
    }
    if (!*frame) {
      if (!co_await ctx.stream.Write(": keepalive\n\n")) co_return std::nullopt;
      continue;
    }
    // Whatever the agent sent in the same read goes out as one HTTP chunk: one write per
    // batch instead of one per event. Back-pressure is unchanged: nothing more is read from
    // the agent until the client has taken the batch. The frames are collected first so that
    // the batch is allocated once at its final size.
    std::vector<service::AttachFrame> frames;
    frames.push_back(std::move(**frame));
    size_t size = SseSizeBound(frames.back());
    while (size < kMaxAttachBatchBytes) {
      std::optional<service::AttachFrame> next = stream->TryNext();
      if (!next) break;
      size += SseSizeBound(*next);
      frames.push_back(std::move(*next));
    }
    std::string batch;
    batch.reserve(size);
    AttachBatch counts;
    bool more = true;
    for (const service::AttachFrame& f : frames) {
      more = AppendAttachEvent(ctx, session_id, f, batch, counts);
      if (!more) break;
    }
    if (!batch.empty() && !co_await ctx.stream.Write(std::move(batch))) {
      stream->Close();  // client gone; the process keeps running
      co_return std::nullopt;
    }
    if (counts.stdout_bytes > 0) streamed_stdout_.Inc(counts.stdout_bytes);
    if (counts.stderr_bytes > 0) streamed_stderr_.Inc(counts.stderr_bytes);
    if (!more) break;
  }
  stream->Close();
  co_await ctx.stream.End();
  co_return std::nullopt;
}

bool Api::AppendAttachEvent(http::RequestContext& ctx, const std::string& session_id,
                            const service::AttachFrame& f, std::string& batch,
                            AttachBatch& counts) {
  auto ev = f.Decode();
  if (!ev.ok()) return false;  // a frame that does not decode ends the stream, unsent
  switch (ev->kind) {
    case service::AttachEvent::Kind::kOutput: {
      const auto& out = ev->output;
      AppendSseOutputEvent(batch, out.event_id, out.stream, out.offset, out.data);
      (out.stream == service::OutputStream::kStderr ? counts.stderr_bytes
                                                    : counts.stdout_bytes) += out.data.size();
      return true;
    }
    case service::AttachEvent::Kind::kResync: {
      const json data = {{"oldest_available_id", ev->resync.oldest_available_id},
                         {"stdout_offset", ev->resync.stdout_offset},
                         {"stderr_offset", ev->resync.stderr_offset}};
      batch += SseEvent(0, "resync_required", data.dump());
      return true;
    }
    case service::AttachEvent::Kind::kExit:
      log::With(ctx.log, [&] { svc_.RecordSessionExit(session_id, ev->exit); });
      batch += SseEvent(ev->exit.event_id, "process_exited", ExitJson(ev->exit).dump());
      return false;  // the exit event ends the stream
    case service::AttachEvent::Kind::kOther:
      break;
  }
  return true;
}

http::asio::awaitable<nlohmann::json> Api::AgentGoneError(http::RequestContext& ctx,
                                                          const std::string& sandbox_id,
                                                          const absl::Status& why) {
  // The agent's sockets close while it is still exiting: give its exit a moment (bounded,
  // on this broken stream only) to become visible before deciding it is not dead. A dead
  // agent fails the sandbox, and the message says how the agent ended.
  std::optional<std::string> lost;
  http::asio::steady_timer pause(ctx.executor);
  for (int i = 0; i < 25 && !(lost = svc_.CheckAgentLost(sandbox_id)); ++i) {
    if (!svc_.HasInstance(sandbox_id)) break;  // deleted meanwhile
    pause.expires_after(std::chrono::milliseconds(20));
    boost::system::error_code ec;
    co_await pause.async_wait(http::asio::redirect_error(http::asio::use_awaitable, ec));
    if (ec) break;
  }
  if (lost) co_return json{{"code", "sandbox_failed"}, {"message", *lost}};
  const bool running = svc_.AgentSocketFor(sandbox_id).has_value();
  co_return json{{"code", running ? "agent_unavailable" : "sandbox_not_running"},
                 {"message", std::string(why.message())}};
}

}  // namespace sbx::api
