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

http::Response Ok(bhttp::status status, const json& body) {
  return JsonResponse(status, body.dump(-1, ' ', false, json::error_handler_t::replace));
}

http::Response Stored(const service::StoredResponse& r) {
  auto res = JsonResponse(static_cast<bhttp::status>(r.status), r.body);
  if (r.replayed) res.set("Idempotent-Replayed", "true");
  return res;
}

std::optional<std::string> Header(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

absl::StatusOr<std::optional<std::string>> IdempotencyKey(const http::Request& req) {
  auto key = Header(req, "Idempotency-Key");
  if (!key) return std::optional<std::string>();
  SBX_RETURN_IF_ERROR(ValidateIdempotencyKey(*key));
  return key;
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

// The access-log line is the server's (http/server.cc), with what Route added to ctx.log.
Awaitable Api::Handle(http::RequestContext& ctx) { return Route(ctx); }

Awaitable Api::Route(http::RequestContext& ctx) {
  const http::Request& req = ctx.req;
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };

  auto parsed = ParseTarget(req.target());
  if (!parsed.ok()) co_return fail(parsed.status());
  const Target& t = *parsed;
  const auto& seg = t.segments;
  const auto method = req.method();

  if (seg.size() == 1 && (seg[0] == "healthz" || seg[0] == "readyz")) {
    if (method != bhttp::verb::get && method != bhttp::verb::head) {
      co_return fail(MethodNotAllowed(req));
    }
    if (seg[0] == "healthz") co_return Ok(bhttp::status::ok, {{"status", "ok"}});
    if (!svc_.ready()) {
      co_return fail(ApiError(absl::StatusCode::kUnavailable, "unavailable",
                              "sbxd is reconciling its sandboxes"));
    }
    co_return Ok(bhttp::status::ok, {{"status", "ready"}});
  }

  if (seg.size() == 1 && seg[0] == "metrics") {
    if (!opts_.metrics_public) {
      // Admin token only: an attach token names one session, not the deployment.
      auto caller = Authenticate(req, std::nullopt, /*allow_attach_token=*/false);
      if (!caller.ok()) co_return fail(caller.status());
    }
    if (method != bhttp::verb::get) co_return fail(MethodNotAllowed(req));
    http::Response res{bhttp::status::ok, 11};
    res.set(bhttp::field::content_type, metrics::kContentType);
    res.set(bhttp::field::cache_control, "no-store");
    res.body() = registry_.Expose();
    co_return res;
  }

  if (seg.empty() || seg[0] != "v1") {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("no route for {}", t.path)));
  }

  // The attach route also accepts the session's attach token.
  const bool is_attach = seg.size() == 4 && seg[1] == "sessions" && seg[3] == "attach";
  // So do the session's other data-plane routes (DESIGN.md: the token authorizes them).
  const bool is_session_io = seg.size() == 4 && seg[1] == "sessions" &&
                             (seg[3] == "stdin" || seg[3] == "stdin:close" ||
                              seg[3] == "signal" || seg[3] == "resize" || seg[3] == "ws");
  auto caller = Authenticate(req, t.Query("token"), is_attach || is_session_io);
  if (!caller.ok()) co_return fail(caller.status());
  // Every line about this request from here on names the tenant and the object in the path.
  // Handlers are coroutines: ctx.log goes along explicitly, and service calls (synchronous)
  // run inside log::With, whose scope cannot span a co_await (common/log.h).
  ctx.log.tenant = caller->tenant_id;
  if (seg.size() >= 3) {
    std::string* field = seg[1] == "sandboxes"    ? &ctx.log.sandbox
                         : seg[1] == "sessions"   ? &ctx.log.session
                         : seg[1] == "operations" ? &ctx.log.operation
                                                  : nullptr;
    const char* prefix = seg[1] == "sandboxes" ? "sbx" : seg[1] == "sessions" ? "ses" : "op";
    // Only well-formed ids: the path is the client's, and the log is not its notepad.
    if (field && IsValidId(seg[2], prefix)) *field = seg[2];
  }
  if (caller->session_scope && !is_attach && !is_session_io) {
    co_return fail(ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                            "an attach token is valid only for its session's data plane "
                            "(attach, ws, stdin, signal, resize)"));
  }

  // /v1/sandboxes
  if (seg.size() == 2 && seg[1] == "sandboxes") {
    if (method == bhttp::verb::post) {
      auto body = ParseCreateSandbox(req.body(), limits());
      if (!body.ok()) co_return fail(body.status());
      auto key = IdempotencyKey(req);
      if (!key.ok()) co_return fail(key.status());
      auto r = log::With(ctx.log, [&] { return svc_.CreateSandbox(*caller, *body, *key); });
      if (!r.ok()) co_return fail(r.status());
      co_return Stored(*r);
    }
    if (method == bhttp::verb::get) {
      store::SandboxFilter f;
      auto limit = ParseLimit(t.Query("limit"));
      if (!limit.ok()) co_return fail(limit.status());
      f.limit = *limit;
      f.state = t.Query("state");
      if (auto label = t.Query("label")) {
        auto l = ParseLabelFilter(*label);
        if (!l.ok()) co_return fail(l.status());
        f.label = *l;
      }
      f.page_token = t.Query("page_token").value_or("");
      auto page = log::With(ctx.log, [&] { return svc_.ListSandboxes(*caller, f); });
      if (!page.ok()) co_return fail(page.status());
      json list = json::array();
      for (const auto& sb : page->items) list.push_back(service::SandboxView(sb));
      co_return Ok(bhttp::status::ok,
                   {{"sandboxes", list},
                    {"next_page_token", page->next_page_token ? json(*page->next_page_token)
                                                              : json(nullptr)}});
    }
    co_return fail(MethodNotAllowed(req));
  }

  // /v1/sandboxes/{id}
  if (seg.size() == 3 && seg[1] == "sandboxes") {
    if (method == bhttp::verb::get) {
      auto sb = log::With(ctx.log, [&] { return svc_.GetSandbox(*caller, seg[2]); });
      if (!sb.ok()) co_return fail(sb.status());
      co_return Ok(bhttp::status::ok, service::SandboxView(*sb));
    }
    if (method == bhttp::verb::delete_) {
      auto key = IdempotencyKey(req);
      if (!key.ok()) co_return fail(key.status());
      auto r = log::With(ctx.log, [&] { return svc_.DeleteSandbox(*caller, seg[2], *key); });
      if (!r.ok()) co_return fail(r.status());
      co_return Stored(*r);
    }
    co_return fail(MethodNotAllowed(req));
  }

  // /v1/sandboxes/{id}/{pause,suspend,wake}
  if (seg.size() == 4 && seg[1] == "sandboxes" &&
      (seg[3] == "pause" || seg[3] == "suspend" || seg[3] == "wake")) {
    if (method != bhttp::verb::post) co_return fail(MethodNotAllowed(req));
    if (auto b = ParseLifecycleBody(req.body()); !b.ok()) co_return fail(b);
    auto key = IdempotencyKey(req);
    if (!key.ok()) co_return fail(key.status());
    auto r = log::With(ctx.log,
                       [&] { return svc_.RequestLifecycle(*caller, seg[2], seg[3], *key); });
    if (!r.ok()) co_return fail(r.status());
    co_return Stored(*r);
  }

  // /v1/sandboxes/{id}/sessions
  if (seg.size() == 4 && seg[1] == "sandboxes" && seg[3] == "sessions") {
    if (method != bhttp::verb::post) co_return fail(MethodNotAllowed(req));
    auto body = ParseCreateSession(req.body());
    if (!body.ok()) co_return fail(body.status());
    auto key = IdempotencyKey(req);
    if (!key.ok()) co_return fail(key.status());
    auto r = log::With(ctx.log, [&] { return svc_.CreateSession(*caller, seg[2], *body, *key); });
    if (!r.ok()) co_return fail(r.status());
    co_return Stored(*r);
  }

  // /v1/operations/{id}
  if (seg.size() == 3 && seg[1] == "operations") {
    if (method != bhttp::verb::get) co_return fail(MethodNotAllowed(req));
    auto wait_ms = ParseWaitMs(t.Query("wait_ms"));
    if (!wait_ms.ok()) co_return fail(wait_ms.status());
    auto op = co_await WaitForOperation(ctx, *caller, seg[2], std::chrono::milliseconds(*wait_ms));
    if (!op.ok()) co_return fail(op.status());
    co_return Ok(bhttp::status::ok, service::OperationView(*op));
  }

  // /v1/sessions/{id}[/attach]
  if (seg.size() == 3 && seg[1] == "sessions") {
    if (method != bhttp::verb::get) co_return fail(MethodNotAllowed(req));
    co_return co_await GetSession(ctx, *caller, seg[2]);
  }
  if (is_attach) {
    if (method != bhttp::verb::get) co_return fail(MethodNotAllowed(req));
    if (caller->session_scope && *caller->session_scope != seg[2]) {
      co_return fail(ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                              "the attach token belongs to another session"));
    }
    co_return co_await Attach(ctx, *caller, seg[2], t);
  }

  if (is_session_io) {
    if (caller->session_scope && *caller->session_scope != seg[2]) {
      co_return fail(ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                              "the attach token belongs to another session"));
    }
    if (seg[3] == "ws") co_return co_await WebSocket(ctx, *caller, seg[2]);
    co_return co_await SessionIo(ctx, *caller, seg[2], seg[3]);
  }
  // /v1/sandboxes/{id}/processes
  if (seg.size() == 4 && seg[1] == "sandboxes" && seg[3] == "processes") {
    co_return co_await Processes(ctx, *caller, seg[2]);
  }
  // /v1/sandboxes/{id}/files... (files_api.cc)
  if (seg.size() == 4 && seg[1] == "sandboxes" && seg[3].rfind("files", 0) == 0) {
    co_return co_await Files(ctx, *caller, seg[2], seg[3], t);
  }

  co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                          fmt::format("no route for {}", t.path)));
}

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

Awaitable Api::GetSession(http::RequestContext& ctx, const service::Caller& caller,
                          const std::string& id) {
  auto s = svc_.GetSession(caller, id);
  if (!s.ok()) co_return Fail(ctx, s.status());
  ctx.log.sandbox = s->sandbox_id;
  if (s->state != "exited") {
    // The agent knows whether the process is still running; the store may lag behind it when
    // no client was attached at exit.
    if (auto agent = svc_.AgentFor(s->sandbox_id)) {
      auto status = co_await agent->Status(ctx.executor, id);
      if (status.ok()) {
        log::With(ctx.log, [&] { svc_.RecordSessionStatus(id, *status); });
        auto again = svc_.GetSession(caller, id);
        if (again.ok()) s = std::move(again);
      }
    }
  }
  co_return Ok(bhttp::status::ok, service::SessionView(*s));
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
