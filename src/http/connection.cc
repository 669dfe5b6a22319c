#include "http/connection.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <openssl/ssl.h>

#include <array>
#include <charconv>

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::http {
namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

// What one read asks for; the read buffer holds one header block and one read.
constexpr size_t kReadChunk = 64 << 10;
// What a refusal reads of the client's remaining bytes before it closes (see Refusal): a
// malformed or too large request, and a reserve slot's request that is not privileged.
constexpr size_t kDrainBad = 16u << 20;
constexpr size_t kDrainShed = 1u << 20;
// How long a closing TLS connection waits for the client's close_notify.
constexpr auto kTlsShutdownTime = std::chrono::seconds(1);

class ChunkedStream : public ResponseStream {
 public:
  // `last`: the connection closes after this response (a reserve slot): the header says so.
  ChunkedStream(MaybeTlsStream& stream, std::chrono::seconds write_timeout,
                RequestCounter& requests, bhttp::verb method, bool last)
      : stream_(stream),
        write_timeout_(write_timeout),
        requests_(requests),
        method_(method),
        last_(last) {}

  asio::awaitable<bool> Begin(bhttp::response_header<> header, bool hold) override {
    status_ = header.result_int();
    requests_.Count(method_, header.result_int());
    bhttp::response<bhttp::empty_body> res{std::move(header)};
    if (last_) res.keep_alive(false);
    // A header with Content-Length: the body goes as it is, and must be exactly that long
    // (End() closes the connection otherwise). Clients that want the length up front (E2B's
    // GET /files) get it without the body being held.
    if (auto cl = res.find(bhttp::field::content_length); cl != res.end()) {
      uint64_t n = 0;
      const std::string_view v(cl->value().data(), cl->value().size());
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec == std::errc() && p == v.data() + v.size()) sized_ = n;
    }
    if (!sized_) res.chunked(true);
    keep_alive_ = res.keep_alive();
    began_ = true;
    if (hold) {
      held_head_ = HeadBytes(res);
      co_return true;
    }
    bhttp::response_serializer<bhttp::empty_body> sr{res};
    stream_.tcp().expires_after(write_timeout_);
    auto [ec, n] = co_await bhttp::async_write_header(stream_, sr, kTuple);
    if (ec) failed_ = true;
    co_return !ec;
  }

  asio::awaitable<bool> Write(std::string data) override {
    if (failed_ || (data.empty() && held_head_.empty())) co_return !failed_;
    const asio::const_buffer b(data.data(), data.size());
    co_return co_await Send(std::span<const asio::const_buffer>(&b, 1), /*last=*/false);
  }

  asio::awaitable<bool> WriteBuffers(const std::vector<asio::const_buffer>& buffers) override {
    if (failed_ || (asio::buffer_size(buffers) == 0 && held_head_.empty())) co_return !failed_;
    co_return co_await Send(buffers, /*last=*/false);
  }

  asio::awaitable<bool> WriteLast(const std::vector<asio::const_buffer>& buffers) override {
    if (failed_ || ended_) co_return !failed_;
    co_return co_await Send(buffers, /*last=*/true);
  }

  asio::awaitable<void> End() override {
    if (failed_ || ended_) co_return;
    co_await Send({}, /*last=*/true);
  }

  bool began() const { return began_; }
  unsigned status() const override { return status_; }
  // The connection can serve another request only after a complete, successful stream.
  bool reusable() const { return began_ && ended_ && !failed_ && keep_alive_; }

 private:
  // The status line and headers as the serializer writes them.
  static std::string HeadBytes(bhttp::response<bhttp::empty_body>& res) {
    bhttp::response_serializer<bhttp::empty_body> sr{res};
    sr.split(true);
    std::string out;
    beast::error_code ec;
    while (!ec && !sr.is_header_done()) {
      sr.next(ec, [&](beast::error_code&, const auto& buffers) {
        for (const auto b : beast::buffers_range_ref(buffers)) {
          out.append(static_cast<const char*>(b.data()), b.size());
        }
        sr.consume(beast::buffer_bytes(buffers));
      });
    }
    return out;
  }

  // One write: the held header if any, `body` (as one chunk, or as it is under a
  // Content-Length) and, if `last`, the end of the body.
  asio::awaitable<bool> Send(std::span<const asio::const_buffer> body, bool last) {
    const size_t size = asio::buffer_size(body);
    if (sized_ && written_ + size > *sized_) {
      failed_ = true;
      co_return false;
    }
    gather_.clear();
    if (!held_head_.empty()) gather_.emplace_back(held_head_.data(), held_head_.size());
    if (size > 0 && !sized_) {
      const auto r = fmt::format_to_n(chunk_size_, sizeof(chunk_size_), "{:x}\r\n", size);
      gather_.emplace_back(chunk_size_, r.size);
    }
    for (const asio::const_buffer& b : body) {
      if (b.size() > 0) gather_.push_back(b);
    }
    if (size > 0 && !sized_) gather_.emplace_back("\r\n", 2);
    if (last && !sized_) gather_.emplace_back("0\r\n\r\n", 5);
    if (last) {
      ended_ = true;
      // Short of the length the header promised: the client must not take it as whole.
      if (sized_ && written_ + size != *sized_) failed_ = true;
    }
    if (!gather_.empty()) {
      stream_.tcp().expires_after(write_timeout_);
      auto [ec, n] = co_await asio::async_write(stream_, gather_, kTuple);
      held_head_.clear();
      written_ += size;
      if (ec) failed_ = true;
    }
    co_return !failed_;
  }

  MaybeTlsStream& stream_;
  std::chrono::seconds write_timeout_;
  RequestCounter& requests_;
  bhttp::verb method_;
  bool last_;
  std::optional<uint64_t> sized_;
  uint64_t written_ = 0;
  bool began_ = false;
  bool ended_ = false;
  bool failed_ = false;
  bool keep_alive_ = false;
  unsigned status_ = 0;
  std::string held_head_;  // Begin(hold): sent with the next write
  std::vector<asio::const_buffer> gather_;
  char chunk_size_[20];  // a chunk's size line
};

// RequestContext::body for a streamed route: reads through a buffer_body parser that took over
// from the header parser, or, for a body of known length (Content-Length), straight from the
// socket into the handler's buffer.
class StreamedBody : public BodyReader {
 public:
  StreamedBody(MaybeTlsStream& stream, beast::flat_buffer& buffer,
               bhttp::request_parser<bhttp::buffer_body>& parser, std::chrono::seconds timeout,
               uint64_t limit, bool expect_continue)
      : stream_(stream),
        buffer_(buffer),
        parser_(parser),
        timeout_(timeout),
        limit_(limit),
        expect_continue_(expect_continue) {
    // The parser would read into the connection's buffer, at most 64 KiB at a time, and copy
    // from there: one more copy of every byte of an upload, and several reads per 256 KiB
    // chunk (issue 15). The length is checked against `limit` before the handler runs
    // (PrepareBody), so there is nothing left for the parser to check.
    if (auto cl = parser_.content_length()) remaining_ = *cl;
  }

  asio::awaitable<absl::StatusOr<size_t>> ReadSome(char* buf, size_t cap) override {
    if (expect_continue_) {
      expect_continue_ = false;
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.tcp().expires_after(timeout_);
      auto [ec, n] = co_await asio::async_write(stream_, asio::buffer(kContinue), kTuple);
      stream_.tcp().expires_never();
      if (ec) co_return absl::UnavailableError(fmt::format("send 100 Continue: {}", ec.message()));
    }
    if (remaining_) co_return co_await ReadKnownLength(buf, cap);
    while (!parser_.is_done()) {
      parser_.get().body().data = buf;
      parser_.get().body().size = cap;
      stream_.tcp().expires_after(timeout_);
      auto [ec, n] = co_await bhttp::async_read_some(stream_, buffer_, parser_, kTuple);
      // No deadline while the handler works between reads (a slow agent is not the client).
      stream_.tcp().expires_never();
      if (ec == bhttp::error::need_buffer) ec = {};
      if (ec == bhttp::error::body_limit) {
        co_return ApiError(absl::StatusCode::kInvalidArgument, "payload_too_large",
                           fmt::format("request body is larger than {} bytes", limit_));
      }
      if (ec == beast::error::timeout) {
        co_return absl::DeadlineExceededError("the request body did not arrive in time");
      }
      if (ec) co_return absl::UnavailableError(fmt::format("read request body: {}", ec.message()));
      const size_t got = cap - parser_.get().body().size;
      if (got > 0) co_return got;
    }
    co_return size_t{0};
  }
  bool done() const override { return remaining_ ? *remaining_ == 0 : parser_.is_done(); }

 private:
  // What the header read brought of the body first (never past it: a pipelined request
  // may follow), then reads of up to `cap` bytes from the socket.
  asio::awaitable<absl::StatusOr<size_t>> ReadKnownLength(char* buf, size_t cap) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(cap, *remaining_));
    if (want == 0) co_return size_t{0};
    if (buffer_.size() > 0) {
      const size_t n = std::min(want, buffer_.size());
      std::memcpy(buf, buffer_.data().data(), n);
      buffer_.consume(n);
      *remaining_ -= n;
      co_return n;
    }
    stream_.tcp().expires_after(timeout_);
    auto [ec, n] = co_await stream_.async_read_some(asio::buffer(buf, want), kTuple);
    stream_.tcp().expires_never();
    if (ec == beast::error::timeout) {
      co_return absl::DeadlineExceededError("the request body did not arrive in time");
    }
    if (ec == asio::error::eof) ec = bhttp::error::partial_message;
    if (ec) co_return absl::UnavailableError(fmt::format("read request body: {}", ec.message()));
    *remaining_ -= n;
    co_return n;
  }

  MaybeTlsStream& stream_;
  beast::flat_buffer& buffer_;
  bhttp::request_parser<bhttp::buffer_body>& parser_;
  std::chrono::seconds timeout_;
  uint64_t limit_;
  bool expect_continue_;
  std::optional<uint64_t> remaining_;  // of a body of known length
};

std::string_view Sv(beast::string_view s) { return std::string_view(s.data(), s.size()); }

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The path of a request target, for logs: never the query, which may hold an attach token
// (?token=) or anything else a client put there; bounded, since a target may be 16 KiB.
std::string_view LoggedPath(std::string_view target) {
  std::string_view path = target.substr(0, target.find_first_of("?#"));
  return path.substr(0, 256);
}

// The access log: one line per request once its response is complete (a stream: once it
// ended). A plain function, not a coroutine: the scope it opens cannot span a co_await.
void LogAccess(const log::Context& ctx, std::string_view method, std::string_view target,
               unsigned status, double ms) {
  if (!spdlog::should_log(spdlog::level::info)) return;
  const std::string_view path = LoggedPath(target);
  log::Scope scope(ctx);
  log::Event(spdlog::level::info,
             {{"method", method}, {"path", path}, {"status", status}, {"duration_ms", ms}},
             "{} {} {} {:.1f} ms", method, path, status, ms);
}

// The client went away while its body was read: nothing to answer.
bool Disconnected(beast::error_code ec) {
  // stream_truncated: a TLS client that closed without close_notify, as most do.
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::ssl::error::stream_truncated ||
         ec == asio::error::connection_reset || ec == asio::error::operation_aborted;
}

// The handler answered before taking the whole body (an error): reads the rest, bounded, so
// that the client, which sends it all before reading, gets the answer instead of a broken
// pipe. False past the bound: the connection then closes.
asio::awaitable<bool> DrainUnreadBody(StreamedBody& body) {
  std::vector<char> sink(64 << 10);
  uint64_t drained = 0;
  while (!body.done() && drained < (uint64_t{256} << 20)) {
    auto n = co_await body.ReadSome(sink.data(), sink.size());
    if (!n.ok() || *n == 0) break;
    drained += *n;
  }
  co_return body.done();
}

}  // namespace

Response UnavailableResponse(const ErrorResponder& errors, const std::string& request_id) {
  Response res = errors(bhttp::status::service_unavailable, "unavailable",
                        "sbxd is at its connection limit; retry later", request_id);
  res.set(bhttp::field::retry_after, "5");
  res.keep_alive(false);
  res.prepare_payload();
  return res;
}

void Connection::ChunkExtensionCheck::operator()(std::uint64_t, beast::string_view ext,
                                                 beast::error_code& ec) const {
  if (ext.size() > limit) ec = bhttp::error::bad_chunk_extension;
}

Connection::Connection(ConnectionEnv env, asio::ip::tcp::socket socket,
                       std::shared_ptr<asio::ssl::context> tls, bool reserve,
                       metrics::Counter& rejected)
    : env_(env),
      stream_(std::move(socket)),
      buffer_(env_.opts.max_header_bytes + kReadChunk),
      deadline_(stream_.get_executor(),
                [this] {
                  boost::system::error_code ignored;
                  stream_.tcp().socket().cancel(ignored);
                }),
      reserve_(reserve),
      rejected_(rejected),
      check_chunk_header_{env_.opts.max_chunk_extension_bytes} {
  if (tls) stream_.StartTls(std::move(tls));
  boost::system::error_code ec;
  const auto peer = stream_.tcp().socket().remote_endpoint(ec);
  if (!ec) peer_ = peer.address().to_string();
}

// Every Refusal handed to Refuse is a named local: g++ 12 corrupted the heap (free(): invalid
// pointer) with a braced temporary in the co_await expression.
asio::awaitable<void> Connection::Run() {
  const ServerOptions& opts = env_.opts;
  // The first request's header is due within header_timeout of the accept, the TLS handshake
  // included.
  deadline_.ExpiresAfter(opts.header_timeout);
  if (stream_.is_tls() && !co_await Handshake()) co_return;
  for (bool first = true;; first = false) {
    // A write's deadline left from the last response must not cut a read short.
    stream_.tcp().expires_never();
    auto [rec, block] = co_await ReadHeader(first);
    const auto started = std::chrono::steady_clock::now();
    if (rec) {
      if (auto refusal = HeaderRefusal(rec)) {
        const RequestLine none;
        co_await Refuse(std::move(*refusal), none, started);
      }
      break;
    }

    HeaderParser parser;
    const std::optional<FramingError> bad = ParseHeader(parser, block);
    RequestLine line;
    if (parser.is_header_done()) {
      line = {Sv(parser.get().method_string()), Sv(parser.get().target()),
              parser.get().method()};
    }
    if (bad) {
      Refusal refusal = FramingRefusal(*bad, parser);
      co_await Refuse(std::move(refusal), line, started);
      break;
    }
    if (reserve_ && !(opts.privileged && opts.privileged(parser.get()))) {
      rejected_.Inc();
      Refusal shed{UnavailableResponse(env_.errors, RequestIdFor(parser.get())), kDrainShed,
                   std::chrono::seconds(1)};
      co_await Refuse(std::move(shed), line, started);
      break;
    }

    // A route that streams its body: the handler reads it (StreamedBody) after this parser
    // hands over what it knows of the framing.
    std::optional<StreamParser> streamed;
    const bool stream_it = !parser.is_done() && opts.stream_body && opts.stream_body(parser.get());
    const uint64_t body_limit = stream_it ? opts.max_streamed_body_bytes : opts.max_body_bytes;
    beast::error_code bec = PrepareBody(parser, stream_it ? &streamed : nullptr, body_limit);
    if (!bec && !streamed && !parser.is_done()) {
      deadline_.ExpiresAfter(opts.read_timeout);
      auto [ec, n] = co_await bhttp::async_read(stream_, buffer_, parser, kTuple);
      bec = ec && deadline_.expired() ? beast::error_code(beast::error::timeout) : ec;
    }
    // Handlers may stream for a long time (SSE): no read deadline while they run.
    deadline_.Never();
    if (bec) {
      if (!Disconnected(bec)) {
        Refusal refusal = BodyRefusal(bec, RequestIdFor(parser.get()), body_limit);
        co_await Refuse(std::move(refusal), line, started);
      }
      break;
    }
    if (!co_await Dispatch(parser, streamed, started)) break;
  }
  if (MaybeTlsStream::Tls* tls = stream_.tls()) {
    // close_notify tells the client that the response ended here rather than being cut off.
    // Bounded: the client need not answer it, and then holds nothing of ours past this.
    stream_.tcp().expires_after(kTlsShutdownTime);
    co_await tls->async_shutdown(kTuple);
  }
  boost::system::error_code ec;
  stream_.tcp().socket().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  stream_.tcp().close();
}

asio::awaitable<bool> Connection::Handshake() {
  // The stream's own timer, not deadline_: it closes the socket when it fires, which ends the
  // handshake wherever it waits, and nothing is to be answered to a client that sent no hello.
  stream_.tcp().expires_at(deadline_.expiry());
  auto [ec] = co_await stream_.tls()->async_handshake(asio::ssl::stream_base::server, kTuple);
  stream_.tcp().expires_never();
  if (!ec) co_return true;
  spdlog::debug("TLS handshake with {}: {}", peer_.empty() ? std::string("?") : peer_,
                ec == beast::error::timeout ? std::string("no hello in time") : ec.message());
  if (ec.category() == asio::error::get_ssl_category() &&
      ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_HTTP_REQUEST) {
    co_await RefusePlainHttp();
  }
  stream_.tcp().close();
  co_return false;
}

asio::awaitable<void> Connection::RefusePlainHttp() {
  // A client that spoke plain HTTP to an HTTPS port gets its answer in plain HTTP: "use
  // https://" instead of a reset it could not explain. Its request went to OpenSSL and is lost:
  // nothing of it is trusted or logged.
  Response res = env_.errors(bhttp::status::bad_request, "invalid_argument",
                             "this port speaks HTTPS only: use https://", NewId("req"));
  PrepareToSend(res, bhttp::verb::unknown, /*last=*/true);
  beast::tcp_stream& tcp = stream_.tcp();
  auto [ec, n] = co_await bhttp::async_write(tcp, res, kTuple);
  if (ec) co_return;
  boost::system::error_code ignored;
  tcp.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  // Read what else it sends for a moment: closing with bytes unread sends a reset, which can
  // destroy the answer before the client reads it.
  tcp.expires_after(std::chrono::seconds(1));
  std::array<char, 4096> sink;
  for (size_t drained = 0; drained < (64u << 10);) {
    auto [dec, dn] = co_await tcp.async_read_some(asio::buffer(sink), kTuple);
    if (dec) break;
    drained += dn;
  }
}

asio::awaitable<beast::error_code> Connection::ReadSome() {
  const size_t room = std::min(kReadChunk, buffer_.max_size() - buffer_.size());
  if (room == 0) co_return bhttp::error::buffer_overflow;
  // Over plain TCP straight from the socket: the tcp_stream's timer bookkeeping is not needed
  // with deadline_, and this read is on every request's path.
  const auto into = buffer_.prepare(room);
  auto [ec, n] = stream_.is_tls() ? co_await stream_.async_read_some(into, kTuple)
                                  : co_await stream_.tcp().socket().async_read_some(into, kTuple);
  buffer_.commit(n);
  if (ec && deadline_.expired()) co_return beast::error::timeout;
  co_return ec;
}

asio::awaitable<std::pair<beast::error_code, size_t>> Connection::ReadHeader(bool first) {
  const ServerOptions& opts = env_.opts;
  // The header is due within header_timeout of its first bytes; the deadline is handed to
  // deadline_ only when a header takes more than one read: moving it earlier than the idle
  // deadline re-arms the timer, and most headers arrive in one read.
  std::optional<LazyDeadline::Clock::time_point> header_due;
  if (!first) {
    if (buffer_.size() == 0) {
      deadline_.ExpiresAfter(opts.idle_timeout);
      if (auto ec = co_await ReadSome()) co_return std::pair{ec, size_t{0}};
    }
    header_due = LazyDeadline::Clock::now() + opts.header_timeout;
  }
  size_t searched = 0;
  for (;;) {
    const std::string_view data(static_cast<const char*>(buffer_.data().data()),
                                buffer_.size());
    // RFC 9112 §2.2: empty lines before a request line are ignored.
    size_t empty = 0;
    while (data.substr(empty, 2) == "\r\n") empty += 2;
    if (empty > 0) {
      buffer_.consume(empty);
      searched = 0;
      continue;
    }
    const size_t end = HeaderBlockEnd(data, searched);
    if (end != std::string_view::npos) {
      if (end > opts.max_header_bytes) {
        co_return std::pair{beast::error_code(bhttp::error::header_limit), size_t{0}};
      }
      co_return std::pair{beast::error_code{}, end};
    }
    if (data.size() >= opts.max_header_bytes) {
      co_return std::pair{beast::error_code(bhttp::error::header_limit), size_t{0}};
    }
    searched = data.size();
    if (header_due) deadline_.ExpiresAt(*header_due);
    if (auto ec = co_await ReadSome()) co_return std::pair{ec, size_t{0}};
  }
}

std::optional<FramingError> Connection::ParseHeader(HeaderParser& parser, size_t block) {
  // The body limit depends on the route (an upload that streams may be large), which is known
  // only once the header is in: Content-Length is checked by hand (PrepareBody), and the
  // parser's limit (for chunked bodies) set then.
  parser.body_limit(boost::none);
  parser.header_limit(static_cast<uint32_t>(env_.opts.max_header_bytes));
  parser.on_chunk_header(check_chunk_header_);
  std::optional<FramingError> bad;
  {
    const std::string_view raw(static_cast<const char*>(buffer_.data().data()), block);
    bad = CheckHeaderBlock(raw);
    if (!bad) {
      beast::error_code pec;
      const size_t used = parser.put(asio::buffer(raw.data(), raw.size()), pec);
      if (!pec && (used != block || !parser.is_header_done())) {
        pec = bhttp::error::partial_message;
      }
      if (pec) {
        bad = FramingError{bhttp::status::bad_request,
                           fmt::format("malformed HTTP request: {}", pec.message())};
      }
    }
  }
  buffer_.consume(block);
  if (!bad) bad = CheckFraming(parser.get());
  return bad;
}

beast::error_code Connection::PrepareBody(HeaderParser& parser,
                                          std::optional<StreamParser>* streamed,
                                          uint64_t body_limit) {
  if (parser.content_length() && *parser.content_length() > body_limit) {
    return bhttp::error::body_limit;
  }
  parser.body_limit(body_limit);
  if (streamed != nullptr) {
    streamed->emplace(std::move(parser));
    (*streamed)->body_limit(body_limit);
    (*streamed)->on_chunk_header(check_chunk_header_);
  }
  return {};
}

asio::awaitable<bool> Connection::Dispatch(HeaderParser& parser,
                                           std::optional<StreamParser>& streamed,
                                           std::chrono::steady_clock::time_point started) {
  const ServerOptions& opts = env_.opts;
  Request req;
  std::optional<StreamedBody> body;
  if (streamed) {
    req.base() = streamed->get().base();
    const auto expect = req.find(bhttp::field::expect);
    body.emplace(stream_, buffer_, *streamed, opts.read_timeout, opts.max_streamed_body_bytes,
                 expect != req.end() && beast::iequals(expect->value(), "100-continue"));
  } else {
    req = parser.release();
  }
  std::string rid = RequestIdFor(req);
  // A reserve slot serves one request: the next client may need it.
  ChunkedStream chunked(stream_, opts.write_timeout, env_.requests, req.method(),
                        /*last=*/reserve_);
  RequestContext ctx{req, rid, chunked, stream_.get_executor()};
  ctx.log.request_id = rid;
  ctx.connection = &stream_;
  ctx.peer_address = peer_;
  if (body) ctx.body = &*body;
  // Handlers may stream for a long time (SSE): no read deadline while they run.
  stream_.tcp().expires_never();
  std::optional<Response> res;
  bool keep = true;
  unsigned status = 0;
  try {
    res = co_await env_.handler(ctx);
  } catch (const std::exception& e) {
    // Our handlers do not throw; this is the last line of defence for library exceptions.
    SBX_LOG_ERROR(ctx.log, "request {} {}: handler threw: {}", Sv(req.method_string()),
                  LoggedPath(Sv(req.target())), e.what());
    if (!chunked.began()) {
      res = env_.errors(bhttp::status::internal_server_error, "internal", "internal error", rid);
    } else {
      keep = false;
    }
  }
  if (ctx.taken_status != 0) {
    // The handler owned the connection (WebSocket): nothing of HTTP is left on it.
    env_.requests.Count(req.method(), ctx.taken_status);
    LogAccess(ctx.log, Sv(req.method_string()), Sv(req.target()), ctx.taken_status,
              MsSince(started));
    co_return false;
  }
  if (res) {
    // Decided before the version is set: an HTTP/1.0 response without a Connection header
    // reads as "close", which made every 1.0 keep-alive request the connection's last.
    const bool keep_alive = res->keep_alive() && req.keep_alive() && !reserve_;
    res->version(req.version());
    res->keep_alive(keep_alive);
    res->set("X-Request-Id", rid);
    status = res->result_int();
    keep = PrepareToSend(*res, req.method(), /*last=*/false);
    auto [ec, n] = co_await bhttp::async_write(stream_, *res, kTuple);
    keep = !ec && keep;
  } else {
    status = chunked.status();
    keep = keep && chunked.reusable();
  }
  if (body && !body->done() && keep) keep = co_await DrainUnreadBody(*body);
  LogAccess(ctx.log, Sv(req.method_string()), Sv(req.target()), status, MsSince(started));
  co_return keep;
}

std::optional<Connection::Refusal> Connection::HeaderRefusal(beast::error_code ec) const {
  if (ec == bhttp::error::header_limit) {
    return Refusal{env_.errors(bhttp::status::request_header_fields_too_large, "invalid_argument",
                               "request headers are too large", NewId("req")),
                   kDrainBad, std::chrono::seconds(2)};
  }
  if (ec == beast::error::timeout && buffer_.size() > 0) {
    // Part of a request came, too slowly (slowloris). A silent connection just closes.
    return Refusal{env_.errors(bhttp::status::request_timeout, "request_timeout",
                               "the request header did not arrive in time", NewId("req"))};
  }
  return std::nullopt;
}

Connection::Refusal Connection::FramingRefusal(const FramingError& bad,
                                               const HeaderParser& parser) const {
  const std::string rid = parser.is_header_done() ? RequestIdFor(parser.get()) : NewId("req");
  const std::string_view code =
      bad.status == bhttp::status::not_implemented ? "not_implemented" : "invalid_argument";
  return {env_.errors(bad.status, code, bad.message, rid), kDrainBad, std::chrono::seconds(2)};
}

Connection::Refusal Connection::BodyRefusal(beast::error_code ec, const std::string& rid,
                                            uint64_t body_limit) const {
  if (ec == beast::error::timeout) {
    return {env_.errors(bhttp::status::request_timeout, "request_timeout",
                        "the request body did not arrive in time", rid)};
  }
  if (ec == bhttp::error::body_limit) {
    return {env_.errors(bhttp::status::payload_too_large, "payload_too_large",
                        fmt::format("request body is larger than {} bytes", body_limit), rid),
            kDrainBad, std::chrono::seconds(2)};
  }
  std::string message;
  if (ec == bhttp::error::buffer_overflow) {
    message = fmt::format(
        "malformed HTTP request: a chunk header or trailer is longer than {} bytes",
        buffer_.max_size());
  } else if (ec == bhttp::error::bad_chunk_extension) {
    message = fmt::format(
        "malformed HTTP request: a chunk extension is malformed or longer than {} bytes",
        check_chunk_header_.limit);
  } else {
    message = fmt::format("malformed HTTP request: {}", ec.message());
  }
  return {env_.errors(bhttp::status::bad_request, "invalid_argument", message, rid), kDrainBad,
          std::chrono::seconds(2)};
}

asio::awaitable<void> Connection::Refuse(Refusal refusal, const RequestLine& line,
                                         std::chrono::steady_clock::time_point started) {
  // The refusal's own write and drain have their own time (the stream's timer).
  deadline_.Never();
  log::Context lctx;
  lctx.request_id = std::string(Sv(refusal.res["X-Request-Id"]));
  const unsigned status = refusal.res.result_int();
  PrepareToSend(refusal.res, line.verb, /*last=*/true);
  co_await bhttp::async_write(stream_, refusal.res, kTuple);
  LogAccess(lctx, line.method, line.target, status, MsSince(started));
  if (refusal.drain == 0) co_return;
  boost::system::error_code ignored;
  stream_.tcp().socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  stream_.tcp().expires_after(refusal.drain_time);
  size_t drained = 0;
  std::vector<char> sink(64 << 10);
  while (drained < refusal.drain) {
    auto [dec, dn] = co_await stream_.async_read_some(asio::buffer(sink), kTuple);
    if (dec) break;
    drained += dn;
  }
}

bool Connection::PrepareToSend(Response& res, bhttp::verb method, bool last) {
  env_.requests.Count(method, res.result_int());
  if (last) res.keep_alive(false);
  res.prepare_payload();
  stream_.tcp().expires_after(env_.opts.write_timeout);
  return res.keep_alive();
}

}  // namespace sbx::http
