// GET /v1/sessions/{id}/ws: a session over one WebSocket. Server -> client: binary frames are
// output bytes (stdout; a tty session has only that stream), text frames are JSON: stderr of
// non-tty sessions {"type":"stderr","data_b64"}, {"type":"resync_required",...},
// {"type":"error","code","message"}, and last {"type":"exit",...} before the close.
// Client -> server: binary frames are stdin bytes; text frames are JSON control messages
// {"type":"resize","rows","cols"}, {"type":"signal","signal"}, {"type":"stdin_close"}.
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/websocket.hpp>
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/requests.h"
#include "api/status_to_http.h"
#include "common/base64.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/tls_stream.h"
#include "service/agent_client.h"

namespace sbx::api {
namespace {

namespace asio = http::asio;
namespace beast = http::beast;
namespace bhttp = http::bhttp;
namespace websocket = boost::beast::websocket;
using nlohmann::json;
using namespace asio::experimental::awaitable_operators;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
// While the agent's stdin buffer is full, the next try is this much later; meanwhile nothing
// more is read from the client, so TCP pushes back on it.
constexpr std::chrono::milliseconds kStdinRetry{20};

json ExitMessage(const service::SessionExit& ev) {
  return {{"type", "exit"},
          {"event_id", ev.event_id},
          {"exit_code", ev.exit_code ? json(*ev.exit_code) : json(nullptr)},
          {"signal", ev.signal ? json(*ev.signal) : json(nullptr)},
          {"timed_out", ev.timed_out},
          {"oom_killed", ev.oom_killed}};
}

// One client message delivered to the agent. kResourceExhausted: its stdin buffer is full.
asio::awaitable<absl::Status> Deliver(asio::any_io_executor ex, service::AgentClient& agent,
                                      const std::string& session_id, bool binary,
                                      const std::string& data, const WsControl& c) {
  if (binary) co_return (co_await agent.Stdin(ex, session_id, data)).status();
  switch (c.type) {
    case WsControl::Type::kResize:
      co_return co_await agent.Resize(ex, session_id, static_cast<uint16_t>(c.rows),
                                      static_cast<uint16_t>(c.cols));
    case WsControl::Type::kSignal:
      co_return co_await agent.Signal(ex, session_id, c.signal);
    case WsControl::Type::kStdinClose:
      break;
  }
  co_return (co_await agent.StdinClose(ex, session_id)).status();
}

// The two directions of one session's WebSocket, run side by side. Output (agent ->
// client) is the only writer of the WebSocket; input (client -> agent) takes one message at a
// time, so that stdin keeps its order.
class WsBridge {
 public:
  WsBridge(http::RequestContext& ctx, websocket::stream<MaybeTlsStream&>& ws,
           service::SandboxService& svc, service::AttachStream& stream,
           service::AgentClient& agent, const store::SessionRecord& session, bool tty,
           std::chrono::milliseconds keepalive)
      : ctx_(ctx), ws_(ws), svc_(svc), stream_(stream), agent_(agent), session_(session),
        tty_(tty), keepalive_(keepalive) {}

  // Agent -> client, until the exit event (or the agent or the client goes away).
  asio::awaitable<void> Output() {
    for (;;) {
      auto frame = co_await stream_.Next(keepalive_);
      if (!frame.ok()) {
        if (refused_) co_return co_await Refuse();
        if (client_gone_) co_return;
        const bool running = svc_.AgentSocketFor(session_.sandbox_id).has_value();
        // Named, not braced temporaries across co_await (GCC 12 coroutine frames).
        const json m = {{"type", "error"},
                        {"code", running ? "agent_unavailable" : "sandbox_not_running"},
                        {"message", std::string(frame.status().message())}};
        co_await SendText(m);
        break;
      }
      if (!*frame) continue;  // idle: the WebSocket's own pings keep it alive
      auto ev = (*frame)->Decode();
      if (!ev.ok()) break;
      bool done = ev->kind == service::AttachEvent::Kind::kExit;
      if (!co_await Send(*ev)) {
        client_gone_ = true;
        co_return;
      }
      if (done) break;
    }
    boost::system::error_code ignored;  // a client that is gone has nothing more to hear
    co_await ws_.async_close(websocket::close_code::normal,
                             asio::redirect_error(asio::use_awaitable, ignored));
  }

  // Client -> agent.
  asio::awaitable<void> Input() {
    asio::steady_timer retry(ctx_.executor);
    for (;;) {
      beast::flat_buffer buf;
      auto [ec, n] = co_await ws_.async_read(buf, kTuple);
      if (ec) break;  // closed by either side, or the peer is gone
      const std::string data = beast::buffers_to_string(buf.data());
      const bool binary = ws_.got_binary();
      WsControl control;
      if (!binary) {
        auto c = ParseWsControl(data);
        if (!c.ok() && IsJsonTooDeep(c.status())) {
          // Not a typo but an attack on whoever walks the tree (issue 13): end the connection.
          SBX_LOG_WARN(ctx_.log, "websocket {}: closing: a client message was refused: {}",
                       session_.id, std::string(c.status().message()));
          refused_ = c.status();
          break;
        }
        if (!c.ok()) {
          SBX_LOG_WARN(ctx_.log, "websocket {}: ignoring a client message: {}", session_.id,
                       std::string(c.status().message()));
          continue;
        }
        control = *c;
      }
      for (;;) {
        absl::Status r =
            co_await Deliver(ctx_.executor, agent_, session_.id, binary, data, control);
        if (r.ok()) break;
        if (r.code() == absl::StatusCode::kResourceExhausted) {
          retry.expires_after(kStdinRetry);
          auto [tec] = co_await retry.async_wait(kTuple);
          if (!tec) continue;
        }
        // The session has exited, has no stdin, or the sandbox went away: the output side
        // reports how the session ended; input has nowhere to go.
        SBX_LOG_DEBUG(ctx_.log, "websocket {}: a client message was not delivered: {}",
                      session_.id, std::string(r.message()));
        break;
      }
      svc_.activity().Touch(session_.sandbox_id);
    }
    // A refused client is still there to hear why; any other end of input means it is gone.
    client_gone_ = !refused_;
    stream_.Close();  // ends a wait for output that nobody would read (or reports the refusal)
  }

 private:
  asio::awaitable<bool> SendText(const json& m) {
    ws_.text(true);
    auto [ec, n] = co_await ws_.async_write(
        asio::buffer(m.dump(-1, ' ', false, json::error_handler_t::replace)), kTuple);
    co_return !ec;
  }

  // One agent event as the client sees it; false when the client is gone.
  asio::awaitable<bool> Send(const service::AttachEvent& ev) {
    using Kind = service::AttachEvent::Kind;
    if (ev.kind == Kind::kOutput) {
      const auto& out = ev.output;
      if (out.stream == service::OutputStream::kStderr && !tty_) {
        const json m = {{"type", "stderr"},
                        {"offset", out.offset},
                        {"data_b64", Base64Encode(out.data)}};
        co_return co_await SendText(m);
      }
      ws_.binary(true);
      auto [ec, n] = co_await ws_.async_write(asio::buffer(out.data.data(), out.data.size()),
                                              kTuple);
      co_return !ec;
    }
    if (ev.kind == Kind::kResync) {
      const json m = {{"type", "resync_required"},
                      {"oldest_available_id", ev.resync.oldest_available_id},
                      {"stdout_offset", ev.resync.stdout_offset},
                      {"stderr_offset", ev.resync.stderr_offset}};
      co_return co_await SendText(m);
    }
    if (ev.kind == Kind::kExit) {
      log::With(ctx_.log, [&] { svc_.RecordSessionExit(session_.id, ev.exit); });
      const json m = ExitMessage(ev.exit);
      co_return co_await SendText(m);
    }
    co_return true;
  }

  // The input side refused a hostile message: tell the client and close with 1008.
  asio::awaitable<void> Refuse() {
    const json m = {{"type", "error"},
                    {"code", ApiCodeFor(*refused_)},
                    {"message", std::string(refused_->message())}};
    co_await SendText(m);
    boost::system::error_code ignored;
    co_await ws_.async_close(
        websocket::close_reason(websocket::close_code::policy_error, "control message refused"),
        asio::redirect_error(asio::use_awaitable, ignored));
  }

  http::RequestContext& ctx_;
  websocket::stream<MaybeTlsStream&>& ws_;
  service::SandboxService& svc_;
  service::AttachStream& stream_;
  service::AgentClient& agent_;
  const store::SessionRecord& session_;
  const bool tty_;
  const std::chrono::milliseconds keepalive_;
  bool client_gone_ = false;
  // Set by the input side when a client message was hostile (nested too deep): the output
  // side, the only writer of the WebSocket, tells the client and closes with 1008.
  std::optional<absl::Status> refused_;
};

}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::WebSocket(
    http::RequestContext& ctx, const service::Caller& caller, const std::string& session_id) {
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };
  if (ctx.req.method() != bhttp::verb::get) {
    co_return fail(MethodNotAllowed(ctx.req, "GET"));
  }
  if (!websocket::is_upgrade(ctx.req)) {
    co_return fail(ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                            "expected a WebSocket upgrade (Connection: Upgrade, Upgrade: "
                            "websocket, Sec-WebSocket-Key, Sec-WebSocket-Version: 13)"));
  }
  if (ctx.connection == nullptr) {
    co_return fail(absl::InternalError("websocket: the server did not hand over the connection"));
  }
  auto target = log::With(ctx.log, [&] { return svc_.PrepareAttach(caller, session_id); });
  if (!target.ok()) co_return fail(target.status());
  ctx.log.sandbox = target->session.sandbox_id;
  auto awake = svc_.activity().StreamOpened(target->session.sandbox_id);

  // Everything retained from the start: a WebSocket client has no Last-Event-ID.
  auto stream = co_await target->agent.Attach(ctx.executor, session_id, 0, target->spec);
  if (!stream.ok()) {
    co_return fail(Annotate(stream.status(), fmt::format("attach {}", session_id)));
  }
  log::With(ctx.log, [&] { svc_.RecordSessionStarted(session_id, stream->started()); });

  websocket::stream<MaybeTlsStream&> ws(*ctx.connection);
  auto timeouts = websocket::stream_base::timeout::suggested(beast::role_type::server);
  timeouts.keep_alive_pings = true;  // an idle terminal is normal; a dead peer is not
  ws.set_option(timeouts);
  ws.set_option(websocket::stream_base::decorator(
      [rid = ctx.request_id](websocket::response_type& res) { res.set("X-Request-Id", rid); }));
  ws.read_message_max(kMaxWsClientMessage);
  ctx.taken_status = 101;
  {
    auto [ec] = co_await ws.async_accept(ctx.req, kTuple);
    if (ec) {
      stream->Close();
      co_return std::nullopt;
    }
  }
  WsBridge bridge(ctx, ws, svc_, *stream, target->agent, target->session,
                  target->spec.tty.has_value(), opts_.keepalive_interval);
  co_await (bridge.Output() && bridge.Input());
  stream->Close();
  co_return std::nullopt;
}

}  // namespace sbx::api
