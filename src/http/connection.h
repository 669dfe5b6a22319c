// One client connection of http::Server: reads its requests one after the other (header
// deadline, strict framing: http/framing.h, body limits), refuses what must not be served,
// runs the handler, and keeps the connection for the next request or ends it. Internal to
// src/http; the server spawns one per accepted connection (server.cc).
//
// The per-request path is benchmarked: a request costs the coroutine frames it did before this
// class (ReadHeader, ReadSome, Dispatch, the handler's own) and copies nothing more.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "http/framing.h"
#include "http/lazy_deadline.h"
#include "http/server.h"

namespace sbx::http {

// What a server lends each of its connections. The server outlives them: its io_context,
// destroyed first, destroys the coroutines still suspended.
struct ConnectionEnv {
  const ServerOptions& opts;
  RequestCounter& requests;
  const Handler& handler;
  const ErrorResponder& errors;
};

// A 503 with Retry-After and Connection: close, in the API's error shape.
Response UnavailableResponse(const ErrorResponder& errors, const std::string& request_id);

class Connection {
 public:
  // `reserve`: the connection holds a reserve slot (ConnectionTable): it serves one request,
  // and only a privileged one; any other is answered 503 and counted in `rejected`.
  // `tls`: the connection speaks TLS with this context (and keeps it while it lives);
  // nullptr: plain HTTP.
  Connection(ConnectionEnv env, asio::ip::tcp::socket socket,
             std::shared_ptr<asio::ssl::context> tls, bool reserve, metrics::Counter& rejected);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Serves requests until the client leaves, a request is refused or a response ends the
  // connection; then shuts the connection down.
  asio::awaitable<void> Run();

 private:
  using HeaderParser = bhttp::request_parser<bhttp::string_body>;
  using StreamParser = bhttp::request_parser<bhttp::buffer_body>;

  // A response the server sends instead of the handler's, as the connection's last: nothing
  // after a request the server refused can be trusted to be framed as the client meant.
  // `drain` bytes (and at most `drain_time`) of what the client still sends are read and
  // discarded first: a client blocked writing a large body would otherwise get a reset instead
  // of the answer.
  struct Refusal {
    Response res;
    size_t drain = 0;
    std::chrono::seconds drain_time{0};
  };
  // What the access log and the refusals name a request by: "-" before its header parsed.
  // Views into the header parser, which outlives every use.
  struct RequestLine {
    std::string_view method = "-";
    std::string_view target = "-";
    bhttp::verb verb = bhttp::verb::unknown;
  };
  // Beast calls this for each chunk header of a chunked body.
  struct ChunkExtensionCheck {
    size_t limit;
    void operator()(std::uint64_t, beast::string_view ext, beast::error_code& ec) const;
  };

  // The server's side of the TLS handshake, due by deadline_. False: the connection is over
  // (a failed handshake is the client's business: logged at debug, never answered over TLS).
  asio::awaitable<bool> Handshake();
  // The answer to a client that sent plain HTTP to the TLS port: a 400 in plain HTTP.
  asio::awaitable<void> RefusePlainHttp();
  // One read into buffer_, given up at deadline_.
  asio::awaitable<beast::error_code> ReadSome();
  // Reads until buffer_ starts with a whole header block; returns its length. A keep-alive
  // connection waits for the next request's first byte with the idle timeout; the header is
  // then due within header_timeout of it (for the first request: of the accept).
  asio::awaitable<std::pair<beast::error_code, size_t>> ReadHeader(bool first);
  // Parses the header block (the first `block` bytes of buffer_, consumed) into `parser` and
  // runs the framing checks on it.
  std::optional<FramingError> ParseHeader(HeaderParser& parser, size_t block);
  // Sets the parser's body limit and, for a route that streams its body (`streamed` not
  // null), hands the parser over to *streamed. Fails with body_limit when Content-Length is
  // already over the limit.
  beast::error_code PrepareBody(HeaderParser& parser, std::optional<StreamParser>* streamed,
                                uint64_t body_limit);
  // Runs the handler on the request that has arrived and sends its response. False when the
  // connection must end after it.
  asio::awaitable<bool> Dispatch(HeaderParser& parser, std::optional<StreamParser>& streamed,
                                 std::chrono::steady_clock::time_point started);

  // The refusals of a request that could not be read, or is not served.
  std::optional<Refusal> HeaderRefusal(beast::error_code ec) const;
  Refusal FramingRefusal(const FramingError& bad, const HeaderParser& parser) const;
  Refusal BodyRefusal(beast::error_code ec, const std::string& request_id,
                      uint64_t body_limit) const;
  asio::awaitable<void> Refuse(Refusal refusal, const RequestLine& line,
                               std::chrono::steady_clock::time_point started);

  // Counts the response and readies it for the write: `last` ends the connection after it,
  // and says so, or a client reusing the connection finds it closed under its next request.
  // True when the connection may serve another request after it.
  bool PrepareToSend(Response& res, bhttp::verb method, bool last);

  ConnectionEnv env_;
  MaybeTlsStream stream_;
  // Bounded: one header block plus one read. Beast keeps a chunk's size line and the trailer
  // here until each is complete, so this bound also ends an endless chunk extension.
  beast::flat_buffer buffer_;
  // The deadline of a header and of a buffered body. Ours, not the stream's: the stream's
  // timer closes the socket when it fires, and then no 408 can go out.
  LazyDeadline deadline_;  // cancels the pending read when it passes
  std::string peer_;  // the client's address, read at the accept ("" if it was already gone)
  const bool reserve_;
  metrics::Counter& rejected_;
  // Beast holds a reference to it while a parser lives.
  ChunkExtensionCheck check_chunk_header_;
};

}  // namespace sbx::http
