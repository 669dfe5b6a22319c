// A small synchronous HTTP/1.1 client for sbxd: JSON requests with error decoding, and an SSE
// reader that hands events to the caller as their bytes arrive. Internally every socket step is
// an async operation run to completion on a private io_context, which is what gives each step a
// deadline and lets SIGINT/SIGTERM cancel whatever is in flight.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/system/error_code.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/sse_parser.h"
#include "common/json_util.h"

namespace boost::asio::ssl {
class context;
}

namespace sbx::cli {

// The deepest JSON the CLI parses from sbxd (common/json_util.h). sbxd's answers nest a few
// levels and what it relays from an agent at most kMaxUntrustedJsonDepth plus its wrapping;
// the limit only keeps a hostile endpoint from crashing the CLI through a recursive dump.
inline constexpr int kMaxResponseJsonDepth = 4 * kMaxUntrustedJsonDepth;

// http://host[:port][/prefix] or https://…
struct Endpoint {
  std::string url;  // as given, without a trailing slash: used in messages
  std::string scheme = "http";  // "http" or "https"
  std::string host;
  std::string port;
  std::string base_path;  // "" or "/prefix"
  // https: how sbxd's certificate is verified (cli/tls.h, SetUpTls); every connection's.
  std::shared_ptr<boost::asio::ssl::context> tls;
  bool https() const { return scheme == "https"; }
};
absl::StatusOr<Endpoint> ParseUrl(std::string_view url);

// Percent-encodes a query component (RFC 3986 unreserved characters pass through).
std::string UrlEncode(std::string_view s);

// Turns a non-2xx response into a status whose message reads
// "404 not_found: sandbox sbx_x not found (request req_…)"; the code follows the HTTP status.
absl::Status DecodeHttpError(unsigned status, std::string_view body, std::string_view request_id);

// A random key for Idempotency-Key headers.
std::string NewIdempotencyKey();

struct HttpResult {
  unsigned status = 0;
  nlohmann::json body;  // null when the body was empty
  std::string request_id;
  bool replayed = false;  // Idempotent-Replayed: true
};

// Receives each event of a stream: true to keep reading, false to stop (e.g. after the last
// event), an error to abort the stream with that error.
using SseHandler = std::function<absl::StatusOr<bool>(const AttachEvent&)>;

struct StreamOptions {
  std::string target;             // "/v1/sessions/ses_…/attach" (joined to the base path)
  std::string token;              // bearer token; empty → the client's token
  std::string last_event_id;      // sent as Last-Event-ID when non-empty
  // A POST that creates the session and answers with its stream (`?attach=true`), with this
  // JSON body and Idempotency-Key; empty: a GET of `target`.
  std::string create_body;
  std::string idempotency_key;
  // The server sends a keepalive every 15 s; silence for this long means the stream is dead.
  std::chrono::seconds idle_timeout{90};
};

class Client {
 public:
  Client(Endpoint endpoint, std::string token);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Endpoint& endpoint() const { return endpoint_; }
  const std::string& token() const { return token_; }

  // Turns SIGINT/SIGTERM into cancellation of the current request, stream or sleep (which then
  // fail with kCancelled). A second signal while interrupted() ends the process at once with
  // 128+signal, after printing `second_signal_note` (if any) to stderr.
  void CatchInterrupts();
  bool interrupted() const { return interrupt_signal_ != 0; }
  int interrupt_signal() const { return interrupt_signal_; }
  void set_second_signal_note(std::string note) { second_signal_note_ = std::move(note); }

  // One request; `body` is sent as JSON when non-null. Non-2xx → DecodeHttpError.
  // A request is retried once on a fresh connection when a reused keep-alive connection turns
  // out to be closed: callers send only GETs and requests carrying an Idempotency-Key.
  absl::StatusOr<HttpResult> Request(std::string_view method, std::string_view target,
                                     const nlohmann::json* body = nullptr,
                                     std::string_view idempotency_key = {});
  absl::StatusOr<nlohmann::json> Get(std::string_view target);

  // Opens an attach stream on a fresh connection and feeds every event to `handler` as soon as
  // its bytes arrive. Asks for the binary form (no base64 and JSON per output chunk) and reads
  // SSE when the server answers with that instead (a server without the binary form). Returns OK when the server ended the response or the handler stopped;
  // the handler's error; otherwise the HTTP or transport error (kUnavailable for a broken
  // connection, kDeadlineExceeded for silence, kCancelled for a signal).
  struct StreamInfo {
    bool connected = false;        // a TCP connection to sbxd was established
    bool got_response = false;     // a 200 text/event-stream response began
    bool ended_mid_event = false;  // the response ended inside an unterminated event
    std::string session_id;        // a create's stream: the session it names (Sbx-Session-Id)
  };
  absl::Status Stream(const StreamOptions& opts, const SseHandler& handler,
                      StreamInfo* info = nullptr);

  // Sleeps, but returns kCancelled early on SIGINT/SIGTERM.
  absl::Status Sleep(std::chrono::milliseconds d);

  std::chrono::seconds request_timeout{60};
  std::chrono::seconds connect_timeout{10};

 private:
  struct Impl;
  // (Re)connects the request connection.
  absl::Status Connect();
  // Closes the connection and turns a socket error into a status (kCancelled for a signal,
  // kDeadlineExceeded for a timeout, kUnavailable otherwise).
  absl::Status TransportError(const boost::system::error_code& ec, std::string_view what,
                              std::chrono::seconds timeout);

  Endpoint endpoint_;
  std::string token_;
  std::unique_ptr<Impl> impl_;
  int interrupt_signal_ = 0;
  std::string second_signal_note_;
};

}  // namespace sbx::cli
