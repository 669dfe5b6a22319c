// A small asynchronous HTTP/1.1 server on Boost.Beast with C++20 coroutines. It knows HTTP
// (keep-alive, chunked bodies both ways, size limits, timeouts) and nothing about sandboxes:
// the api/ layer hands it one Handler.
//
// Threads: the server runs an io_context on `threads` threads; each connection lives on its own
// strand, so a handler's coroutine never runs concurrently with itself.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "common/metrics.h"

namespace sbx::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

using Request = bhttp::request<bhttp::string_body>;
using Response = bhttp::response<bhttp::string_body>;

// Writes a streamed (chunked) response. Used by handlers that return no Response, like SSE.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Sends the status line and headers with Transfer-Encoding: chunked. False if the client is
  // gone.
  virtual asio::awaitable<bool> Begin(bhttp::response_header<> header) = 0;
  // Sends one chunk; false if the client is gone (the handler should stop).
  virtual asio::awaitable<bool> Write(std::string data) = 0;
  // Ends the chunked body; the connection may then serve the next request.
  virtual asio::awaitable<void> End() = 0;
};

// The body of a request whose route streams it (ServerOptions::stream_body): the handler reads
// it piece by piece instead of the server reading it whole into Request::body().
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // Reads up to `cap` bytes of the body into `buf`; 0 once the body is complete. Errors: the
  // client broke off or was too slow (Unavailable / DeadlineExceeded), or the body is larger
  // than ServerOptions::max_streamed_body_bytes (payload_too_large). Sends "100 Continue"
  // first when the client asked for it.
  virtual asio::awaitable<absl::StatusOr<size_t>> ReadSome(char* buf, size_t cap) = 0;
  virtual bool done() const = 0;
};

struct RequestContext {
  Request& req;
  std::string request_id;
  ResponseStream& stream;
  asio::any_io_executor executor;
  // The request's log context (request_id filled in by the server). Handlers add what they
  // learn (tenant, sandbox, session); the access-log line at the end of the request carries
  // it. Handlers are coroutines: pass it explicitly (SBX_LOG_*, log::With), see common/log.h.
  log::Context log;
  // For a handler that takes the connection over (a WebSocket upgrade): the connection's
  // stream, valid while the handler runs. A handler that writes to it sets `taken_status` (101)
  // and returns nullopt; the server then sends nothing more and closes the connection.
  beast::tcp_stream* connection = nullptr;
  unsigned taken_status = 0;
  // Set for routes that stream their body (req.body() is then empty); nullptr otherwise.
  BodyReader* body = nullptr;
};

// Returns the full response, or nullopt after streaming one through ctx.stream.
using Handler = std::function<asio::awaitable<std::optional<Response>>(RequestContext&)>;
// Builds the error response the server itself sends (400, 408, 413) in the API's JSON shape.
using ErrorResponder =
    std::function<Response(bhttp::status status, std::string_view code, std::string_view message,
                           const std::string& request_id)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 7070;  // 0 picks a free port; see Server::port()
  int threads = 2;
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  std::chrono::seconds read_timeout{30};   // a whole request must arrive within this
  std::chrono::seconds idle_timeout{75};   // keep-alive connection with no request
  std::chrono::seconds write_timeout{60};  // one write must complete within this
  // Where sbx_http_requests_total goes; nullptr: metrics::Default().
  metrics::Registry* metrics = nullptr;
  // Asked once a request's header has arrived: true makes the handler read the body through
  // RequestContext::body (file uploads), bounded by max_streamed_body_bytes instead of
  // max_body_bytes and by read_timeout per read instead of for the whole body.
  std::function<bool(const Request&)> stream_body;
  uint64_t max_streamed_body_bytes = uint64_t{64} << 30;
};

// sbx_http_requests_total{method,code}: every response the server sends, its own errors (400,
// 408, 413) included. Label values are bounded: the method is one of a fixed set or "other",
// the code a status the server produced. A child is looked up once per (method, code) and
// then found in a fixed table without a lock.
class RequestCounter {
 public:
  explicit RequestCounter(metrics::Registry& registry);
  void Count(bhttp::verb method, unsigned code);

 private:
  static constexpr std::array<std::string_view, 8> kMethods = {
      "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other"};
  static constexpr unsigned kFirstCode = 100, kLastCode = 599;
  static size_t MethodIndex(bhttp::verb method);

  metrics::Family<metrics::Counter>& family_;
  std::array<std::array<std::atomic<metrics::Counter*>, kLastCode - kFirstCode + 1>,
             kMethods.size()>
      table_{};
};

class Server {
 public:
  Server(ServerOptions opts, Handler handler, ErrorResponder errors);
  ~Server();

  // Binds and listens; fails with the address and errno text when the port is taken.
  absl::Status Listen();
  uint16_t port() const { return bound_port_; }
  // Runs the io_context on opts.threads threads; returns immediately.
  void Start();
  // Stops accepting, cancels connections and joins the threads.
  void Stop();
  asio::io_context& io_context() { return ioc_; }

 private:
  asio::awaitable<void> AcceptLoop();
  asio::awaitable<void> Serve(asio::ip::tcp::socket socket);

  ServerOptions opts_;
  RequestCounter requests_;
  Handler handler_;
  ErrorResponder errors_;
  asio::io_context ioc_;
  asio::ip::tcp::acceptor acceptor_;
  uint16_t bound_port_ = 0;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
};

// A request id: the client's X-Request-Id when it is 1-128 printable ASCII, else a new one.
std::string RequestIdFor(const Request& req);

}  // namespace sbx::http
