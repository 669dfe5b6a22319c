#include "api/api.h"
#include "api/handler_util.h"

#include <cctype>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/attach_events.h"
#include "api/e2b/e2b.h"
#include "api/e2b/state.h"
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

// Output chunks of the binary form up to this size are copied next to their header rather
// than sent as a buffer of their own.
constexpr size_t kCopyBelowBytes = 4096;

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

absl::StatusOr<bool> WantsBinaryAttach(const http::Request& req, const Target& t) {
  if (std::optional<std::string> format = t.Query("format")) {
    if (*format == "sse") return false;
    if (*format == "binary") return true;
    return FieldError("format", "must be \"sse\" or \"binary\"");
  }
  auto it = req.find(bhttp::field::accept);
  if (it == req.end()) return false;
  std::string accept(it->value());
  for (char& c : accept) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return accept.find(kBinaryAttachContentType) != std::string::npos;
}

absl::Status MethodNotAllowed(const http::Request& req, std::string_view allow) {
  return WithDetail(ApiError(absl::StatusCode::kInvalidArgument, "method_not_allowed",
                             fmt::format("method {} is not allowed on {} (allowed: {})",
                                         std::string(req.method_string()),
                                         std::string(req.target()), allow)),
                    "allow", allow);
}

// The error response for `s`. A 500 is a bug or a broken host, which only the log can explain
// to an operator (the client sees "internal"); the other errors are the client's business and
// the access-log line records their status.
http::Response Fail(const http::RequestContext& ctx, const absl::Status& s) {
  http::Response res = ErrorResponse(s, ctx.request_id);
  if (res.result() == bhttp::status::internal_server_error) {
    SBX_LOG_ERROR(ctx.log, "internal error: {}", std::string(s.message()));
  } else if (res.result() == bhttp::status::bad_gateway && ApiCodeFor(s) == "bad_agent_reply") {
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
      streamed_stderr_(StreamedBytes(registry_).WithLabels({"stderr"})),
      e2b_(std::make_unique<e2b::State>()) {}

Api::~Api() {
  for (uint64_t h : upstreams_.Clear()) svc_.job_waiters().Remove(h);
}

void Api::SetLimits(const ResourceLimits& limits) {
  std::lock_guard lock(limits_mu_);
  opts_.limits = limits;
}

ResourceLimits Api::limits() const {
  std::lock_guard lock(limits_mu_);
  return opts_.limits;
}

absl::StatusOr<service::Principal> Api::Authenticate(
    const http::Request& req, const std::optional<std::string>& query_token,
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
  return AuthenticateToken(*token, allow_attach_token);
}

absl::StatusOr<service::Principal> Api::AuthenticateToken(const std::string& bearer,
                                                          bool allow_attach_token) const {
  const std::string* token = &bearer;
  if (allow_attach_token && service::LooksLikeAttachToken(*token)) {
    SBX_ASSIGN_OR_RETURN(auto claims, svc_.attach_tokens().Verify(*token));
    service::Principal p;
    p.caller = service::Caller{claims.tenant_id, claims.session_id};
    p.caller.scopes = static_cast<uint32_t>(service::Scope::kSessions);
    return p;
  }
  if (opts_.tenancy != nullptr && token->rfind(service::kMgmtTokenPrefix, 0) == 0) {
    return opts_.tenancy->Authenticate(*token, std::chrono::system_clock::now());
  }
  // Hashing first makes the comparison length-independent as well as constant-time.
  if (!ConstantTimeEquals(Sha256Hex(*token), admin_token_hash_)) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated", "invalid token");
  }
  if (opts_.tenancy != nullptr) return opts_.tenancy->Bootstrap();
  service::Principal p;
  p.caller = service::Caller{"default", std::nullopt};
  p.caller.token_id = service::kBootstrapTokenId;
  return p;
}

bool Api::Privileged(const http::Request& req) const {
  if (auto t = ParseTarget(req.target()); t.ok() && t->segments.size() == 1 &&
                                          (t->segments[0] == "healthz" ||
                                           t->segments[0] == "readyz")) {
    return true;
  }
  // The operator's admin only: a tenant's token must not reach the reserve kept for them.
  auto who = Authenticate(req, std::nullopt, /*allow_attach_token=*/false);
  return who.ok() && service::IsOperatorAdmin(who->caller);
}

// The access-log line is the server's (http/server.cc), with what Route (routes.cc) added to
// ctx.log.
// A sandbox port's request (path or host name, port_routes.cc) never reaches the route table.
// E2B's routes (e2b/e2b.h) are told apart by their paths and headers, which sbx's own never
// use; its envd answers on the host-name route's port 49983.
Awaitable Api::Handle(http::RequestContext& ctx) {
  if (auto port = MatchPort(ctx.req)) {
    if (port->ok() && (*port)->by_host && (*port)->port == e2b::kEnvdPort) {
      return e2b::Gateway::HandleEnvd(*this, ctx, (*port)->sandbox_id);
    }
    return ProxyPort(ctx, std::move(*port));
  }
  if (e2b::Gateway::Matches(ctx.req)) return e2b::Gateway::Handle(*this, ctx);
  return Route(ctx);
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
    // The engine's key of the operation's job: its sandbox, or the tag a template job makes.
    const std::string key = op->sandbox_id.empty() ? "tpl:" + op->target : op->sandbox_id;
    const uint64_t handle = waiters.Add(key, [timer, ex = ctx.executor] {
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
                      const std::string& session_id, const Target& t, const CreatedHere* created) {
  const std::string& rid = ctx.request_id;
  // The form first: a malformed request is a 400 whatever the session's state.
  auto binary = WantsBinaryAttach(ctx.req, t);
  if (!binary.ok()) co_return Fail(ctx, binary.status());
  auto target = log::With(ctx.log, [&] { return svc_.PrepareAttach(caller, session_id); });
  if (!target.ok()) co_return Fail(ctx, target.status());
  ctx.log.sandbox = target->session.sandbox_id;
  // An attached client keeps the sandbox from being suspended for idleness.
  auto awake = svc_.activity().StreamOpened(target->session.sandbox_id);

  uint64_t after = 0;
  std::optional<std::string> last = Header(ctx.req, "Last-Event-ID");
  if (!last) last = t.Query("last_event_id");
  // A session this request made has sent nothing yet: a Last-Event-ID (say, from a retry whose
  // Idempotency-Key had expired) would only hide its first events.
  if (created != nullptr && !created->replayed) last.reset();
  if (last) {
    auto v = ParseLastEventId(*last);
    if (!v.ok()) co_return Fail(ctx, v.status());
    after = *v;
  }
  auto stream = co_await target->agent.Attach(ctx.executor, session_id, after, target->spec);
  if (!stream.ok()) {
    co_return Fail(ctx, Annotate(stream.status(), fmt::format("attach {}", session_id)));
  }
  // SSE's 4/3 base64 growth keeps its batch near kMaxAttachBatchBytes.
  const size_t max_payload = *binary ? kMaxAttachBatchBytes : kMaxAttachBatchBytes / 4 * 3;
  // A process over within kAttachExitWithin (an exec of a short command) is stored as started
  // and exited in one transaction; either way before the client gets a byte.
  std::optional<service::SessionExit> exited;
  if (stream->started()) exited = co_await stream->ExitWithin(service::kAttachExitWithin, max_payload);
  log::With(ctx.log, [&] { svc_.RecordSessionStarted(session_id, stream->started(), exited); });

  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(ctx.req.version());
  header.set(bhttp::field::content_type,
             *binary ? std::string(kBinaryAttachContentType) : std::string("text/event-stream"));
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Accel-Buffering", "no");
  header.set("X-Request-Id", rid);
  if (created != nullptr) {
    // What the 201 of a plain create carries in its body, for a client that later re-attaches
    // (GET …/attach with Last-Event-ID) or asks for the exit status.
    header.set(bhttp::field::location, "/v1/sessions/" + session_id);
    header.set("Sbx-Session-Id", session_id);
    if (created->replayed) header.set("Idempotent-Replayed", "true");
  }
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  // A process that is over (just now, or before this attach) has its whole answer at hand:
  // the header goes with its first events (and the end, if they are all), one write and one
  // wake-up of the client instead of three. A running process's header goes at once: the
  // client learns the session from it.
  const bool over = exited.has_value() || target->session.state == "exited";
  if (!co_await ctx.stream.Begin(std::move(header), /*hold=*/over)) {
    co_return std::nullopt;
  }
  attach_streams_.Inc();
  struct OpenStream {
    metrics::Gauge& gauge;
    ~OpenStream() { gauge.Dec(); }
  } open_stream{attach_streams_};

  // Whatever the agent sent in the same read goes out as one HTTP chunk: one write per batch
  // instead of one per event. Back-pressure is unchanged: nothing more is read from the agent
  // until the client has taken the batch. The frames point into the agent stream's buffer,
  // and `batch` (the SSE text, or the binary form's headers) keeps its capacity from batch to
  // batch: a busy stream allocates nothing per batch, and the binary form copies no output.
  std::vector<service::AttachFrame> frames;
  ByteBuffer batch;
  AttachPieces pieces;
  std::vector<http::asio::const_buffer> buffers;
  for (;;) {
    absl::Status got = co_await stream->NextBatch(opts_.keepalive_interval, max_payload, frames);
    if (!got.ok()) {
      // The agent went away before the exit event: the sandbox was deleted, or its agent died.
      const json err = co_await AgentGoneError(ctx, target->session.sandbox_id, got);
      const std::string text = err.dump();
      std::string last_event = *binary ? BinaryEvent(BinaryKind::kError, 0, 0, text)
                                       : SseEvent(0, "error", text);
      co_await ctx.stream.Write(std::move(last_event));
      break;
    }
    if (frames.empty()) {
      std::string keepalive = *binary ? BinaryEvent(BinaryKind::kKeepalive, 0, 0, "")
                                      : std::string(": keepalive\n\n");
      if (!co_await ctx.stream.Write(std::move(keepalive))) co_return std::nullopt;
      continue;
    }
    batch.clear();
    pieces.clear();
    AttachBatch counts;
    bool more = true;
    for (const service::AttachFrame& f : frames) {
      more = AppendAttachEvent(ctx, session_id, f, *binary, batch, pieces, counts);
      if (!more) break;
    }
    buffers.clear();
    if (*binary) {
      for (const AttachPiece& p : pieces) {
        if (p.end > p.begin) buffers.emplace_back(batch.data() + p.begin, p.end - p.begin);
        if (!p.data.empty()) buffers.emplace_back(p.data.data(), p.data.size());
      }
    } else if (!batch.empty()) {
      buffers.emplace_back(batch.data(), batch.size());
    }
    // The batch with the exit event is the last: it goes with the body's end.
    const bool sent = more ? buffers.empty() || co_await ctx.stream.WriteBuffers(buffers)
                           : co_await ctx.stream.WriteLast(buffers);
    if (!sent) {
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
                            const service::AttachFrame& f, bool binary, ByteBuffer& batch,
                            AttachPieces& pieces, AttachBatch& counts) {
  auto ev = f.Decode();
  if (!ev.ok()) return false;  // a frame that does not decode ends the stream, unsent
  // The binary form: header (and a control event's JSON) in `batch`, the output bytes where
  // the agent stream holds them; small chunks are copied, as a separate buffer costs more.
  const size_t begin = batch.size();
  auto control = [&](BinaryKind kind, uint64_t id, const std::string& text) {
    AppendBinaryEvent(batch, kind, id, 0, text);
    pieces.push_back(AttachPiece{begin, batch.size(), {}});
  };
  switch (ev->kind) {
    case service::AttachEvent::Kind::kOutput: {
      const auto& out = ev->output;
      if (binary) {
        const BinaryKind kind = out.stream == service::OutputStream::kStderr ? BinaryKind::kStderr
                                                                             : BinaryKind::kStdout;
        if (out.data.size() <= kCopyBelowBytes) {
          AppendBinaryEvent(batch, kind, out.event_id, out.offset, out.data);
          pieces.push_back(AttachPiece{begin, batch.size(), {}});
        } else {
          AppendBinaryHeader(batch, kind, out.event_id, out.offset,
                             static_cast<uint32_t>(out.data.size()));
          pieces.push_back(AttachPiece{begin, batch.size(), out.data});
        }
      } else {
        AppendSseOutputEvent(batch, out.event_id, out.stream, out.offset, out.data);
      }
      (out.stream == service::OutputStream::kStderr ? counts.stderr_bytes
                                                    : counts.stdout_bytes) += out.data.size();
      return true;
    }
    case service::AttachEvent::Kind::kResync: {
      const json data = {{"oldest_available_id", ev->resync.oldest_available_id},
                         {"stdout_offset", ev->resync.stdout_offset},
                         {"stderr_offset", ev->resync.stderr_offset}};
      if (binary) {
        control(BinaryKind::kResyncRequired, 0, data.dump());
      } else {
        batch.append(SseEvent(0, "resync_required", data.dump()));
      }
      return true;
    }
    case service::AttachEvent::Kind::kExit:
      log::With(ctx.log, [&] { svc_.RecordSessionExit(session_id, ev->exit); });
      if (binary) {
        control(BinaryKind::kProcessExited, ev->exit.event_id, ExitJson(ev->exit).dump());
      } else {
        batch.append(SseEvent(ev->exit.event_id, "process_exited", ExitJson(ev->exit).dump()));
      }
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
