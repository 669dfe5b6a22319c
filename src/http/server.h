// A small asynchronous HTTP/1.1 server on Boost.Beast with C++20 coroutines. It knows HTTP
// (keep-alive, chunked bodies both ways, size limits, timeouts, strict framing: http/framing.h)
// and bounds what a client may hold (connection caps, header deadline: see ServerOptions), and
// nothing about sandboxes: the api/ layer hands it one Handler and the `privileged` predicate.
//
// Threads: the server runs `threads` io_contexts, one thread each; a connection is given to one
// of them (in turn) at its accept and stays there, on its own strand, so a handler's coroutine
// never runs concurrently with itself. Not one io_context shared by every thread: asio then
// wakes an idle thread for each I/O completion, and one exec round trip (a session and its
// attach) cost sbxd 37 context switches instead of 9 (issue 15, perf stat).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <boost/asio/ssl/context.hpp>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/tls_stream.h"
#include "http/connection_table.h"

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
  // Sends the status line and headers with Transfer-Encoding: chunked, or, when the header
  // sets Content-Length, with that length: the writes are then exactly that many bytes (more
  // fails, fewer makes End() close the connection). False if the client is
  // gone.
  asio::awaitable<bool> Begin(bhttp::response_header<> header) {
    return Begin(std::move(header), /*hold=*/false);
  }
  // `hold`: keep the status line and headers back and send them with the first write or
  // End(), in one write. For a handler whose first bytes are already at hand (the attach of a
  // process that is over): a held header reaches the client no sooner than those bytes.
  virtual asio::awaitable<bool> Begin(bhttp::response_header<> header, bool hold) = 0;
  // Sends one chunk; false if the client is gone (the handler should stop).
  virtual asio::awaitable<bool> Write(std::string data) = 0;
  // Sends the bytes of `buffers`, in order, as one chunk; they stay the caller's and must
  // outlive the call. A streaming handler can so reuse its buffers from write to write and
  // send pieces (a frame header, then bytes it holds elsewhere) without joining them first.
  virtual asio::awaitable<bool> WriteBuffers(const std::vector<asio::const_buffer>& buffers) = 0;
  // Ends the chunked body; the connection may then serve the next request.
  virtual asio::awaitable<void> End() = 0;
  // WriteBuffers, then End, in one write: a handler that knows its last bytes saves the client
  // a wake-up and the server a write. False if the client is gone.
  virtual asio::awaitable<bool> WriteLast(const std::vector<asio::const_buffer>& buffers) = 0;
  // The status Begin sent (0 before it).
  virtual unsigned status() const = 0;
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
  // stream, valid while the handler runs; plain TCP or TLS (connection->tls()), an Asio stream
  // either way. A handler that writes to it sets `taken_status` (101) and returns nullopt; the
  // server then sends nothing more and closes the connection.
  MaybeTlsStream* connection = nullptr;
  unsigned taken_status = 0;
  // The client's address ("" if unknown), read once per connection: what a proxied request's
  // X-Forwarded-For names.
  std::string_view peer_address;
  // Set for routes that stream their body (req.body() is then empty); nullptr otherwise.
  BodyReader* body = nullptr;
};

// Returns the full response, or nullopt after streaming one through ctx.stream.
using Handler = std::function<asio::awaitable<std::optional<Response>>(RequestContext&)>;
// Builds the error response the server itself sends (400, 408, 413, 431, 501, 503, 505) in the
// API's JSON shape.
using ErrorResponder =
    std::function<Response(bhttp::status status, std::string_view code, std::string_view message,
                           const std::string& request_id)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 7070;  // 0 picks a free port; see Server::port()
  int threads = 2;
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  // A request's line and headers must be in within this: from the accept for a connection's
  // first request, from its first byte for the next ones. One deadline for the whole block,
  // not per read, so a header trickled a byte at a time (slowloris) ends there too.
  std::chrono::seconds header_timeout{10};
  std::chrono::seconds read_timeout{30};   // a request's body must arrive within this
  std::chrono::seconds idle_timeout{75};   // keep-alive connection with no request
  std::chrono::seconds write_timeout{60};  // one write must complete within this
  // Connection caps (http/connection_table.h). The daemon derives them from RLIMIT_NOFILE.
  size_t max_connections = 1024;
  size_t max_connections_per_ip = 256;
  // Slots past the caps, for `privileged` requests only; as many spare descriptors are held
  // so that they are there when accept runs out of descriptors (EMFILE).
  size_t reserved_connections = 16;
  // A request a reserve slot may serve (/healthz, the admin token); others get 503. Unset:
  // none.
  std::function<bool(const Request&)> privileged;
  // Beast keeps a chunk's size line in the read buffer until it is complete and counts none
  // of it against the body limit: a longer extension is refused (the battery sent 8 MiB).
  size_t max_chunk_extension_bytes = 4 << 10;
  // Where sbx_http_requests_total goes; nullptr: metrics::Default().
  metrics::Registry* metrics = nullptr;
  // Asked once a request's header has arrived: true makes the handler read the body through
  // RequestContext::body (file uploads), bounded by max_streamed_body_bytes instead of
  // max_body_bytes and by read_timeout per read instead of for the whole body.
  std::function<bool(const Request&)> stream_body;
  uint64_t max_streamed_body_bytes = uint64_t{64} << 30;
  // Set: the listener speaks only HTTPS, with this context (http/tls.h); Server::SetTls
  // replaces it later. Unset: plain HTTP.
  std::shared_ptr<asio::ssl::context> tls;
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

// Descriptors held open (on /dev/null) so that there is one to give up when accept fails
// with EMFILE: the connection it then takes is served from the reserve or refused with a 503,
// instead of staying in the backlog while accept fails in a loop.
class SpareFds {
 public:
  explicit SpareFds(size_t target);
  ~SpareFds();
  SpareFds(const SpareFds&) = delete;
  SpareFds& operator=(const SpareFds&) = delete;
  // Closes one; false when none is held.
  bool GiveUp();
  // Reopens up to the target; stops at the first failure (still out of descriptors).
  void Refill();
  size_t held() const { return held_.load(std::memory_order_relaxed); }
  // Every spare is held: the process is not short of descriptors.
  bool full() const { return held() >= target_; }

 private:
  const size_t target_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::atomic<size_t> held_{0};
};

class Server {
 public:
  Server(ServerOptions opts, Handler handler, ErrorResponder errors);
  ~Server();

  // Binds and listens; fails with the address and errno text when the port is taken.
  absl::Status Listen();
  uint16_t port() const { return bound_port_; }
  // Runs the io_contexts, one thread each; returns immediately.
  void Start();
  // Stops accepting, cancels connections and joins the threads.
  void Stop();
  // The context of the accept loop (the first one).
  asio::io_context& io_context() { return *iocs_.front(); }
  // A new TLS context (a reloaded certificate) for the connections accepted from now on; those
  // already open keep theirs. Only a server started with TLS takes one: the scheme of the
  // listener does not change while it runs.
  absl::Status SetTls(std::shared_ptr<asio::ssl::context> tls);
  bool tls() const { return tls_enabled_; }

 private:
  asio::awaitable<void> AcceptLoop();
  // accept failed with EMFILE/ENFILE: give up a spare, take one connection, serve it from the
  // reserve or refuse it. Never returns at once twice without progress (no busy loop).
  asio::awaitable<void> ShedAtFdLimit();
  // Serves one accepted connection (http/connection.h) while `lease` holds its slot.
  asio::awaitable<void> Serve(asio::ip::tcp::socket socket, ConnectionTable::Lease lease);
  // Answers 503 to a connection that has no slot, without reading its request, and closes it;
  // `drain`: first read what the client sends for a moment (bounded), so that the 503 is not
  // lost to a reset. A TLS listener sends nothing: the connection closes.
  void Refuse(asio::ip::tcp::socket socket, std::string_view reason, bool drain);
  asio::awaitable<void> DrainAndClose(asio::ip::tcp::socket socket);
  metrics::Counter& Rejected(std::string_view reason);
  // Where the next accepted connection lives: the contexts in turn.
  asio::io_context& NextContext();

  ServerOptions opts_;
  RequestCounter requests_;
  Handler handler_;
  ErrorResponder errors_;
  metrics::Family<metrics::Counter>& rejected_family_;
  metrics::Counter& rejected_max_;
  metrics::Counter& rejected_per_ip_;
  metrics::Counter& rejected_fds_;
  // Before iocs_: destroying an io_context destroys the coroutines still suspended, whose
  // leases then release into this table.
  ConnectionTable connections_;
  SpareFds spares_;
  std::atomic<int> draining_{0};
  // Rate limits of the accept loop's warnings (the loop is one coroutine).
  std::chrono::steady_clock::time_point fd_log_at_{}, cap_log_at_{}, accept_log_at_{};
  uint64_t fd_log_held_ = 0, cap_log_held_ = 0, accept_log_held_ = 0;
  std::vector<std::unique_ptr<asio::io_context>> iocs_;
  // Keep every context's run() going while it has no connection.
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::atomic<size_t> next_ioc_{0};
  asio::ip::tcp::acceptor acceptor_;
  uint16_t bound_port_ = 0;
  const bool tls_enabled_;
  mutable std::mutex tls_mu_;
  std::shared_ptr<asio::ssl::context> tls_;  // guarded by tls_mu_
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
};

// A request id: the client's X-Request-Id when it is 1-128 printable ASCII, else a new one.
std::string RequestIdFor(const Request& req);

}  // namespace sbx::http
