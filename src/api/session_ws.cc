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
#include "protocol/protocol.h"
#include "service/agent_stream.h"

namespace sbx::api {
namespace {

namespace asio = http::asio;
namespace beast = http::beast;
namespace bhttp = http::bhttp;
namespace websocket = boost::beast::websocket;
using nlohmann::json;
using namespace asio::experimental::awaitable_operators;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::chrono::milliseconds kAgentCallTimeout{5000};
// While the agent's stdin buffer is full, the next try is this much later; meanwhile nothing
// more is read from the client, so TCP pushes back on it.
constexpr std::chrono::milliseconds kStdinRetry{20};

json ExitMessage(const protocol::ExitEvent& ev) {
  return {{"type", "exit"},
          {"event_id", ev.event_id},
          {"exit_code", ev.exit_code ? json(*ev.exit_code) : json(nullptr)},
          {"signal", ev.signal ? json(*ev.signal) : json(nullptr)},
          {"timed_out", ev.timed_out},
          {"oom_killed", ev.oom_killed}};
}

// A client's control message as the agent request it stands for.
json AgentCall(const WsControl& c, const std::string& session_id) {
  switch (c.type) {
    case WsControl::Type::kResize:
      return json{{"op", "resize"}, {"session_id", session_id}, {"rows", c.rows},
                  {"cols", c.cols}};
    case WsControl::Type::kSignal:
      return json{{"op", "signal"}, {"session_id", session_id}, {"signal", c.signal}};
    case WsControl::Type::kStdinClose:
      break;
  }
  return json{{"op", "stdin_close"}, {"session_id", session_id}};
}

}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::WebSocket(
    http::RequestContext& ctx, const service::Caller& caller, const std::string& session_id) {
  auto fail = [&](const absl::Status& s) -> std::optional<http::Response> {
    return Fail(ctx, s);
  };
  if (ctx.req.method() != bhttp::verb::get) {
    co_return fail(MethodNotAllowed(ctx.req));
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
  const bool tty = target->session.spec.contains("tty");

  // Everything retained from the start: a WebSocket client has no Last-Event-ID.
  json request = {{"op", "attach"},
                  {"session_id", session_id},
                  {"after_event_id", 0},
                  {"spec", target->session.spec}};
  auto opened = co_await service::AgentStream::Open(ctx.executor, target->agent_socket, request);
  if (!opened.ok()) {
    co_return fail(Annotate(opened.status(), fmt::format("attach {}", session_id)));
  }
  std::unique_ptr<service::AgentStream> stream = std::move(*opened);
  log::With(ctx.log, [&] { svc_.RecordSessionStarted(session_id, stream->response()); });

  websocket::stream<beast::tcp_stream&> ws(*ctx.connection);
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

  bool client_gone = false;
  // Set by the input side when a client message was hostile (nested too deep): the output
  // side, the only writer of the WebSocket, tells the client and closes with 1008.
  std::optional<absl::Status> refused;
  auto send_text = [&](const json& m) -> asio::awaitable<bool> {
    ws.text(true);
    auto [ec, n] = co_await ws.async_write(
        asio::buffer(m.dump(-1, ' ', false, json::error_handler_t::replace)), kTuple);
    co_return !ec;
  };

  // Agent -> client, until the exit event (or the agent or the client goes away).
  auto output = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto frame = co_await stream->Next(opts_.keepalive_interval);
      if (!frame.ok()) {
        if (refused) {
          const json m = {{"type", "error"},
                          {"code", ApiCodeFor(*refused)},
                          {"message", std::string(refused->message())}};
          co_await send_text(m);
          boost::system::error_code ignored;
          co_await ws.async_close(
              websocket::close_reason(websocket::close_code::policy_error,
                                      "control message refused"),
              asio::redirect_error(asio::use_awaitable, ignored));
          co_return;
        }
        if (client_gone) co_return;
        const bool running = svc_.AgentSocketFor(target->session.sandbox_id).has_value();
        // Named, not braced temporaries across co_await (GCC 12 coroutine frames).
        const json m = {{"type", "error"},
                        {"code", running ? "agent_unavailable" : "sandbox_not_running"},
                        {"message", std::string(frame.status().message())}};
        co_await send_text(m);
        break;
      }
      if (!*frame) continue;  // idle: the WebSocket's own pings keep it alive
      const protocol::Frame& f = **frame;
      bool ok = true, done = false;
      if (f.type == protocol::FrameType::kOutput) {
        auto out = protocol::DecodeOutputView(f.payload);
        if (!out.ok()) break;
        if (out->stream == protocol::Stream::kStderr && !tty) {
          const json m = {{"type", "stderr"},
                          {"offset", out->offset},
                          {"data_b64", Base64Encode(out->data)}};
          ok = co_await send_text(m);
        } else {
          ws.binary(true);
          auto [ec, n] = co_await ws.async_write(asio::buffer(out->data.data(), out->data.size()),
                                                 kTuple);
          ok = !ec;
        }
      } else if (f.type == protocol::FrameType::kResync) {
        auto rs = protocol::DecodeResync(f.payload);
        if (!rs.ok()) break;
        const json m = {{"type", "resync_required"},
                        {"oldest_available_id", rs->oldest_available_id},
                        {"stdout_offset", rs->stdout_offset},
                        {"stderr_offset", rs->stderr_offset}};
        ok = co_await send_text(m);
      } else if (f.type == protocol::FrameType::kExit) {
        auto ev = protocol::DecodeExit(f.payload);
        if (!ev.ok()) break;
        log::With(ctx.log, [&] { svc_.RecordSessionExit(session_id, *ev); });
        const json m = ExitMessage(*ev);
        ok = co_await send_text(m);
        done = true;
      }
      if (!ok) {
        client_gone = true;
        co_return;
      }
      if (done) break;
    }
    boost::system::error_code ignored;  // a client that is gone has nothing more to hear
    co_await ws.async_close(websocket::close_code::normal,
                            asio::redirect_error(asio::use_awaitable, ignored));
  };

  // Client -> agent, one message at a time, so that stdin keeps its order.
  auto input = [&]() -> asio::awaitable<void> {
    asio::steady_timer retry(ctx.executor);
    for (;;) {
      beast::flat_buffer buf;
      auto [ec, n] = co_await ws.async_read(buf, kTuple);
      if (ec) break;  // closed by either side, or the peer is gone
      const std::string data = beast::buffers_to_string(buf.data());
      json call;
      if (ws.got_binary()) {
        call = {{"op", "stdin"}, {"session_id", session_id}, {"data_b64", Base64Encode(data)}};
      } else {
        auto c = ParseWsControl(data);
        if (!c.ok() && IsJsonTooDeep(c.status())) {
          // Not a typo but an attack on whoever walks the tree (issue 13): end the connection.
          SBX_LOG_WARN(ctx.log, "websocket {}: closing: a client message was refused: {}",
                       session_id, std::string(c.status().message()));
          refused = c.status();
          break;
        }
        if (!c.ok()) {
          SBX_LOG_WARN(ctx.log, "websocket {}: ignoring a client message: {}", session_id,
                       std::string(c.status().message()));
          continue;
        }
        call = AgentCall(*c, session_id);
      }
      for (;;) {
        auto r = co_await service::AsyncCallAgent(ctx.executor, target->agent_socket, call,
                                                  kAgentCallTimeout);
        if (r.ok()) break;
        if (r.status().code() == absl::StatusCode::kResourceExhausted) {
          retry.expires_after(kStdinRetry);
          auto [tec] = co_await retry.async_wait(kTuple);
          if (!tec) continue;
        }
        // The session has exited, has no stdin, or the sandbox went away: the output side
        // reports how the session ended; input has nowhere to go.
        SBX_LOG_DEBUG(ctx.log, "websocket {}: {} not delivered: {}", session_id,
                      call.value("op", ""), std::string(r.status().message()));
        break;
      }
      svc_.activity().Touch(target->session.sandbox_id);
    }
    // A refused client is still there to hear why; any other end of input means it is gone.
    client_gone = !refused;
    stream->Close();  // ends a wait for output that nobody would read (or reports the refusal)
  };

  co_await (output() && input());
  stream->Close();
  co_return std::nullopt;
}

}  // namespace sbx::api
