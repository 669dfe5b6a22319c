#include "cli/ws_session.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <optional>

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast.hpp>
#include <boost/beast/websocket.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/tls.h"
#include "common/base64.h"

namespace sbx::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = boost::beast::websocket;
using tcp = asio::ip::tcp;
using nlohmann::json;
using namespace asio::experimental::awaitable_operators;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

// The local terminal in raw mode for as long as this object lives: every key (Ctrl-C, Ctrl-Z,
// Ctrl-D included) becomes a byte for the remote terminal, and output is shown as it comes.
class RawTerminal {
 public:
  explicit RawTerminal(int fd) : fd_(fd) {
    if (::tcgetattr(fd_, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(fd_, TCSAFLUSH, &raw) == 0;
  }
  ~RawTerminal() {
    if (active_) ::tcsetattr(fd_, TCSAFLUSH, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

std::string ResizeMessage(std::pair<int, int> size) {
  // The server takes 1..1000; a larger local window is clamped, not refused.
  return json{{"type", "resize"},
              {"rows", std::min(size.first, 1000)},
              {"cols", std::min(size.second, 1000)}}
      .dump();
}

// One `sbx exec -i` session: the WebSocket, the local terminal, and how the session ended.
class WsSession {
 public:
  WsSession(const Endpoint& endpoint, const std::string& token, const std::string& session_id,
            bool tty)
      : ws_(ioc_),
        endpoint_(endpoint),
        token_(token),
        session_id_(session_id),
        tty_(tty),
        target_(fmt::format("{}/v1/sessions/{}/ws", endpoint.base_path, session_id)) {}

  absl::StatusOr<int> Run() {
    asio::co_spawn(ioc_, Main(), asio::detached);
    ioc_.run();
    raw_.reset();  // messages below go to a cooked terminal
    if (exit_code_) return *exit_code_;
    if (stopped_by_signal_ != 0) {
      PrintError(fmt::format("interrupted; session {} keeps running", session_id_));
      return 128 + stopped_by_signal_;
    }
    if (failure_) return *failure_;
    return absl::InternalError("websocket session ended without a result");
  }

 private:
  asio::awaitable<void> Main() {
    if (!co_await Connect()) co_return;
    if (tty_ && ::isatty(STDIN_FILENO)) raw_.emplace(STDIN_FILENO);
    co_await (Output() || Input());
    if (stopped_by_signal_ != 0) {
      boost::system::error_code ignored;  // the session goes on whether or not the close arrives
      co_await ws_.async_close(websocket::close_code::normal,
                               asio::redirect_error(asio::use_awaitable, ignored));
    }
    raw_.reset();
  }

  // Resolves, connects and upgrades; false (with failure_ set) when any of it fails.
  asio::awaitable<bool> Connect() {
    tcp::resolver resolver(ioc_);
    auto [rec, results] = co_await resolver.async_resolve(endpoint_.host, endpoint_.port, kTuple);
    if (rec) {
      failure_ = absl::UnavailableError(
          fmt::format("cannot reach sbxd at {}: {}", endpoint_.url, rec.message()));
      co_return false;
    }
    beast::tcp_stream& tcp = ws_.next_layer().tcp();
    tcp.expires_after(std::chrono::seconds(10));
    auto [cec, ep] = co_await tcp.async_connect(results, kTuple);
    if (cec) {
      failure_ = absl::UnavailableError(
          fmt::format("cannot reach sbxd at {}: {}", endpoint_.url, cec.message()));
      co_return false;
    }
    if (endpoint_.https()) {
      if (auto st = PrepareTls(ws_.next_layer(), endpoint_); !st.ok()) {
        failure_ = st;
        co_return false;
      }
      // The handshake shares the connect's deadline.
      auto [tec] = co_await ws_.next_layer().tls()->async_handshake(
          asio::ssl::stream_base::client, kTuple);
      if (tec) {
        failure_ = TlsHandshakeError(tec, ws_.next_layer(), endpoint_);
        co_return false;
      }
    }
    ws_.next_layer().tcp().expires_never();
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
    ws_.set_option(websocket::stream_base::decorator([this](websocket::request_type& req) {
      req.set(beast::http::field::authorization, "Bearer " + token_);
    }));
    websocket::response_type res;
    auto [hec] = co_await ws_.async_handshake(res, endpoint_.host + ":" + endpoint_.port,
                                              target_, kTuple);
    if (hec) {
      if (res.result_int() != 0 && res.result_int() != 101) {
        failure_ = DecodeHttpError(res.result_int(), res.body(), std::string(res["X-Request-Id"]));
      } else {
        failure_ = absl::UnavailableError(
            fmt::format("websocket to {}{}: {}", endpoint_.url, target_, hec.message()));
      }
      co_return false;
    }
    co_return true;
  }

  // Server -> terminal until the exit message and the close.
  asio::awaitable<void> Output() {
    for (;;) {
      beast::flat_buffer buf;
      auto [ec, n] = co_await ws_.async_read(buf, kTuple);
      if (ec) {
        if (!exit_code_ && !failure_) {
          failure_ = absl::UnavailableError(fmt::format(
              "the connection to sbxd ended before the process exited: {}", ec.message()));
        }
        co_return;
      }
      const std::string data = beast::buffers_to_string(buf.data());
      if (ws_.got_binary()) {
        (void)WriteAll(STDOUT_FILENO, data);
        continue;
      }
      json m = ParseUntrustedJson(data, kMaxResponseJsonDepth).value_or(json());
      if (m.is_object()) OnMessage(m);
    }
  }

  void OnMessage(const json& m) {
    const std::string type = JsonString(m, "type");
    if (type == "stderr") {
      if (auto bytes = Base64Decode(JsonString(m, "data_b64"))) {
        (void)WriteAll(STDERR_FILENO, *bytes);
      }
    } else if (type == "error") {
      failure_ = absl::AbortedError(fmt::format("session {}: {}: {}", session_id_,
                                                JsonString(m, "code"), JsonString(m, "message")));
    } else if (type == "resync_required") {
      PrintError("warning: output was lost (resync_required)");
    } else if (type == "exit") {
      OnExit(m);
    }
  }

  void OnExit(const json& m) {
    raw_.reset();  // messages below go to a cooked terminal
    const json code = m.contains("exit_code") ? m["exit_code"] : json();
    const json sig = m.contains("signal") ? m["signal"] : json();
    const bool timed_out = m.value("timed_out", false) == true;
    if (timed_out) PrintError("process was killed: its timeout expired");
    if (m.value("oom_killed", false) == true) PrintError("process was killed: out of memory");
    if (code.is_number_integer()) {
      exit_code_ = static_cast<int>(code.get<int64_t>() & 0xff);
    } else if (sig.is_string()) {
      const int n = SignalNumber(sig.get<std::string>());
      if (!timed_out) PrintError(fmt::format("process was killed by {}", sig.get<std::string>()));
      exit_code_ = n > 0 ? 128 + n : kExitFailure;
    } else {
      exit_code_ = kExitFailure;
    }
  }

  // Terminal -> server: stdin bytes, window size changes, and our own interruption.
  asio::awaitable<void> Input() {
    asio::signal_set signals(ioc_, SIGINT, SIGTERM, SIGHUP);
    signals.add(SIGWINCH);
    std::optional<asio::posix::stream_descriptor> in;
    {
      const int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
      if (fd >= 0) in.emplace(ioc_, fd);
    }
    std::string chunk(16 << 10, '\0');
    for (;;) {
      int sig = 0;
      if (!in) {
        auto [ec, s] = co_await signals.async_wait(kTuple);
        if (ec) co_return;
        sig = s;
      } else {
        auto r = co_await (in->async_read_some(asio::buffer(chunk), kTuple) ||
                           signals.async_wait(kTuple));
        if (r.index() == 0) {
          auto [ec, n] = std::get<0>(r);
          if (ec) {
            // EOF (or an unreadable stdin): the session's stdin ends too.
            in.reset();
            const std::string close_message = R"({"type":"stdin_close"})";
            if (!co_await Send(false, close_message)) co_return;
            continue;
          }
          if (!co_await Send(true, std::string_view(chunk.data(), n))) co_return;
          continue;
        }
        auto [ec, s] = std::get<1>(r);
        if (ec) co_return;
        sig = s;
      }
      if (!co_await OnSignal(sig)) co_return;
    }
  }

  // SIGWINCH becomes a resize; any other signal ends the session here (it keeps running in
  // the sandbox). False when input stops.
  asio::awaitable<bool> OnSignal(int sig) {
    if (sig != SIGWINCH) {
      stopped_by_signal_ = sig;
      co_return false;
    }
    if (auto size = TerminalSize(STDIN_FILENO)) {
      const std::string m = ResizeMessage(*size);
      co_return co_await Send(false, m);
    }
    co_return true;
  }

  asio::awaitable<bool> Send(bool binary, std::string_view data) {
    ws_.binary(binary);
    auto [ec, n] = co_await ws_.async_write(asio::buffer(data.data(), data.size()), kTuple);
    co_return !ec;
  }

  asio::io_context ioc_;
  websocket::stream<MaybeTlsStream> ws_;
  const Endpoint& endpoint_;
  const std::string& token_;
  const std::string& session_id_;
  const bool tty_;
  const std::string target_;
  std::optional<RawTerminal> raw_;
  std::optional<absl::Status> failure_;
  std::optional<int> exit_code_;
  int stopped_by_signal_ = 0;
};

}  // namespace

std::optional<std::pair<int, int>> TerminalSize(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0 || ws.ws_col == 0) return std::nullopt;
  return std::make_pair(static_cast<int>(ws.ws_row), static_cast<int>(ws.ws_col));
}

absl::StatusOr<int> RunWebSocketSession(const Endpoint& endpoint, const std::string& token,
                                        const std::string& session_id, bool tty) {
  return WsSession(endpoint, token, session_id, tty).Run();
}

}  // namespace sbx::cli
