#include "http/server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::http {
namespace {

using asio::use_awaitable;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

class ChunkedStream : public ResponseStream {
 public:
  ChunkedStream(beast::tcp_stream& stream, std::chrono::seconds write_timeout,
                RequestCounter& requests, bhttp::verb method)
      : stream_(stream), write_timeout_(write_timeout), requests_(requests), method_(method) {}

  asio::awaitable<bool> Begin(bhttp::response_header<> header) override {
    status_ = header.result_int();
    requests_.Count(method_, header.result_int());
    bhttp::response<bhttp::empty_body> res{std::move(header)};
    res.chunked(true);
    bhttp::response_serializer<bhttp::empty_body> sr{res};
    stream_.expires_after(write_timeout_);
    auto [ec, n] = co_await bhttp::async_write_header(stream_, sr, kTuple);
    began_ = !ec;
    keep_alive_ = res.keep_alive();
    if (ec) failed_ = true;
    co_return !ec;
  }

  asio::awaitable<bool> Write(std::string data) override {
    if (failed_ || data.empty()) co_return !failed_;
    stream_.expires_after(write_timeout_);
    auto [ec, n] = co_await asio::async_write(stream_, bhttp::make_chunk(asio::buffer(data)), kTuple);
    if (ec) failed_ = true;
    co_return !ec;
  }

  asio::awaitable<void> End() override {
    if (failed_ || ended_) co_return;
    ended_ = true;
    stream_.expires_after(write_timeout_);
    auto [ec, n] = co_await asio::async_write(stream_, bhttp::make_chunk_last(), kTuple);
    if (ec) failed_ = true;
  }

  bool began() const { return began_; }
  unsigned status() const { return status_; }
  // The connection can serve another request only after a complete, successful stream.
  bool reusable() const { return began_ && ended_ && !failed_ && keep_alive_; }

 private:
  beast::tcp_stream& stream_;
  std::chrono::seconds write_timeout_;
  RequestCounter& requests_;
  bhttp::verb method_;
  bool began_ = false;
  bool ended_ = false;
  bool failed_ = false;
  bool keep_alive_ = false;
  unsigned status_ = 0;
};

// RequestContext::body for a streamed route: reads through a buffer_body parser that took over
// from the header parser.
class StreamedBody : public BodyReader {
 public:
  StreamedBody(beast::tcp_stream& stream, beast::flat_buffer& buffer,
               bhttp::request_parser<bhttp::buffer_body>& parser, std::chrono::seconds timeout,
               uint64_t limit, bool expect_continue)
      : stream_(stream),
        buffer_(buffer),
        parser_(parser),
        timeout_(timeout),
        limit_(limit),
        expect_continue_(expect_continue) {}

  asio::awaitable<absl::StatusOr<size_t>> ReadSome(char* buf, size_t cap) override {
    if (expect_continue_) {
      expect_continue_ = false;
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(timeout_);
      auto [ec, n] = co_await asio::async_write(stream_, asio::buffer(kContinue), kTuple);
      stream_.expires_never();
      if (ec) co_return absl::UnavailableError(fmt::format("send 100 Continue: {}", ec.message()));
    }
    while (!parser_.is_done()) {
      parser_.get().body().data = buf;
      parser_.get().body().size = cap;
      stream_.expires_after(timeout_);
      auto [ec, n] = co_await bhttp::async_read_some(stream_, buffer_, parser_, kTuple);
      // No deadline while the handler works between reads (a slow agent is not the client).
      stream_.expires_never();
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
  bool done() const override { return parser_.is_done(); }

 private:
  beast::tcp_stream& stream_;
  beast::flat_buffer& buffer_;
  bhttp::request_parser<bhttp::buffer_body>& parser_;
  std::chrono::seconds timeout_;
  uint64_t limit_;
  bool expect_continue_;
};

bool PrintableId(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

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

}  // namespace

RequestCounter::RequestCounter(metrics::Registry& registry)
    : family_(registry.AddCounter("sbx_http_requests_total",
                                  "HTTP responses sent, by request method and status code.",
                                  {"method", "code"})) {}

size_t RequestCounter::MethodIndex(bhttp::verb method) {
  switch (method) {
    case bhttp::verb::get:
      return 0;
    case bhttp::verb::head:
      return 1;
    case bhttp::verb::post:
      return 2;
    case bhttp::verb::put:
      return 3;
    case bhttp::verb::delete_:
      return 4;
    case bhttp::verb::patch:
      return 5;
    case bhttp::verb::options:
      return 6;
    default:
      return kMethods.size() - 1;
  }
}

void RequestCounter::Count(bhttp::verb method, unsigned code) {
  const size_t m = MethodIndex(method);
  if (code < kFirstCode || code > kLastCode) {
    family_.WithLabels({kMethods[m], std::to_string(code)}).Inc();
    return;
  }
  std::atomic<metrics::Counter*>& slot = table_[m][code - kFirstCode];
  metrics::Counter* c = slot.load(std::memory_order_acquire);
  if (c == nullptr) {
    // Racing first uses find the same child; either store is right.
    c = &family_.WithLabels({kMethods[m], std::to_string(code)});
    slot.store(c, std::memory_order_release);
  }
  c->Inc();
}

std::string RequestIdFor(const Request& req) {
  auto it = req.find("X-Request-Id");
  if (it != req.end()) {
    std::string_view v(it->value().data(), it->value().size());
    if (PrintableId(v)) return std::string(v);
  }
  return NewId("req");
}

Server::Server(ServerOptions opts, Handler handler, ErrorResponder errors)
    : opts_(std::move(opts)),
      requests_(opts_.metrics != nullptr ? *opts_.metrics : metrics::Default()),
      handler_(std::move(handler)),
      errors_(std::move(errors)),
      ioc_(opts_.threads),
      acceptor_(ioc_) {}

Server::~Server() { Stop(); }

absl::Status Server::Listen() {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(opts_.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        fmt::format("listen address '{}' is not an IP address: {}", opts_.host, ec.message()));
  }
  asio::ip::tcp::endpoint ep(addr, opts_.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        fmt::format("listen on {}:{}: {}", opts_.host, opts_.port, ec.message()));
  }
  bound_port_ = acceptor_.local_endpoint().port();
  return absl::OkStatus();
}

void Server::Start() {
  asio::co_spawn(ioc_, AcceptLoop(), asio::detached);
  for (int i = 0; i < std::max(1, opts_.threads); ++i) {
    threads_.emplace_back([this] { ioc_.run(); });
  }
}

void Server::Stop() {
  if (stopped_.exchange(true)) return;
  asio::post(ioc_, [this] {
    boost::system::error_code ec;
    acceptor_.close(ec);
  });
  ioc_.stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

asio::awaitable<void> Server::AcceptLoop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(ioc_), kTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || stopped_) co_return;
      // EMFILE and friends: log, back off briefly, keep accepting.
      spdlog::warn("accept: {}", ec.message());
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    socket.set_option(asio::ip::tcp::no_delay(true), ec);
    auto ex = socket.get_executor();
    asio::co_spawn(ex, Serve(std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> Server::Serve(asio::ip::tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  auto executor = co_await asio::this_coro::executor;

  // `last`: the server closes the connection after this response (a malformed or rejected
  // request) and says so, or a client reusing the connection finds it closed under its next
  // request (a flaky 413 test showed it).
  auto send = [&](Response res, bhttp::verb method, bool last = false) -> asio::awaitable<bool> {
    requests_.Count(method, res.result_int());
    if (last) res.keep_alive(false);
    res.prepare_payload();
    stream.expires_after(opts_.write_timeout);
    bool keep = res.keep_alive();
    auto [ec, n] = co_await bhttp::async_write(stream, res, kTuple);
    co_return !ec && keep;
  };

  for (;;) {
    bhttp::request_parser<bhttp::string_body> parser;
    // The body limit depends on the route (an upload that streams may be large), which is
    // known only once the header is in: Content-Length is checked by hand below, and the
    // parser's limit (for chunked bodies) set then.
    parser.body_limit(boost::none);
    parser.header_limit(static_cast<uint32_t>(opts_.max_header_bytes));

    // Wait for the first byte of the next request with the idle timeout, then give the whole
    // request the read timeout.
    stream.expires_after(buffer.size() > 0 ? opts_.read_timeout : opts_.idle_timeout);
    auto [hec, hn] = co_await bhttp::async_read_header(stream, buffer, parser, kTuple);
    // A route that streams its body: the handler reads it (StreamedBody) after this parser
    // hands over what it knows of the framing.
    std::optional<bhttp::request_parser<bhttp::buffer_body>> streamed;
    const bool stream_it =
        !hec && !parser.is_done() && opts_.stream_body && opts_.stream_body(parser.get());
    const uint64_t body_limit = stream_it ? opts_.max_streamed_body_bytes : opts_.max_body_bytes;
    if (!hec && parser.content_length() && *parser.content_length() > body_limit) {
      hec = bhttp::error::body_limit;
    }
    if (!hec) parser.body_limit(body_limit);
    if (!hec && stream_it) {
      streamed.emplace(std::move(parser));
      streamed->body_limit(body_limit);
    } else if (!hec && !parser.is_done()) {
      stream.expires_after(opts_.read_timeout);
      auto [bec, bn] = co_await bhttp::async_read(stream, buffer, parser, kTuple);
      hec = bec;
    }
    if (hec) {
      if (hec == bhttp::error::end_of_stream || hec == asio::error::eof ||
          hec == asio::error::connection_reset || hec == asio::error::operation_aborted) {
        break;
      }
      const auto failed_at = std::chrono::steady_clock::now();
      std::string method = "-", target = "-";
      if (parser.is_header_done()) {
        method = std::string(Sv(parser.get().method_string()));
        target = std::string(Sv(parser.get().target()));
      }
      log::Context lctx;
      if (hec == beast::error::timeout) {
        if (buffer.size() > 0 || parser.got_some()) {
          lctx.request_id = NewId("req");
          co_await send(errors_(bhttp::status::request_timeout, "request_timeout",
                                "the request did not arrive in time", lctx.request_id),
                        parser.is_header_done() ? parser.get().method() : bhttp::verb::unknown,
                        /*last=*/true);
          LogAccess(lctx, method, target, 408, MsSince(failed_at));
        }
        break;
      }
      std::string rid = parser.is_header_done() ? RequestIdFor(parser.get()) : NewId("req");
      lctx.request_id = rid;
      bhttp::status status;
      const bhttp::verb verb =
          parser.is_header_done() ? parser.get().method() : bhttp::verb::unknown;
      if (hec == bhttp::error::body_limit) {
        status = bhttp::status::payload_too_large;
        co_await send(errors_(status, "payload_too_large",
                              fmt::format("request body is larger than {} bytes", body_limit),
                              rid),
                      verb, /*last=*/true);
      } else if (hec == bhttp::error::header_limit) {
        status = bhttp::status::request_header_fields_too_large;
        co_await send(errors_(status, "invalid_argument", "request headers are too large", rid),
                      verb, /*last=*/true);
      } else {
        status = bhttp::status::bad_request;
        co_await send(errors_(status, "invalid_argument",
                              fmt::format("malformed HTTP request: {}", hec.message()), rid),
                      verb, /*last=*/true);
      }
      LogAccess(lctx, method, target, static_cast<unsigned>(status), MsSince(failed_at));
      // The framing of anything after a bad request cannot be trusted, so the connection ends.
      // Read and discard what the client is still sending (bounded in bytes and time) before
      // closing: a client blocked writing a large body would otherwise get EPIPE instead of
      // reading our 4xx.
      boost::system::error_code ignored;
      stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
      stream.expires_after(std::chrono::seconds(2));
      size_t drained = 0;
      std::vector<char> sink(64 << 10);
      while (drained < (16u << 20)) {
        auto [dec, dn] = co_await stream.async_read_some(asio::buffer(sink), kTuple);
        if (dec) break;
        drained += dn;
      }
      break;
    }

    Request req;
    std::optional<StreamedBody> body;
    if (streamed) {
      req.base() = streamed->get().base();
      const auto expect = req.find(bhttp::field::expect);
      body.emplace(stream, buffer, *streamed, opts_.read_timeout, opts_.max_streamed_body_bytes,
                   expect != req.end() && beast::iequals(expect->value(), "100-continue"));
    } else {
      req = parser.release();
    }
    std::string rid = RequestIdFor(req);
    ChunkedStream chunked(stream, opts_.write_timeout, requests_, req.method());
    RequestContext ctx{req, rid, chunked, executor};
    ctx.log.request_id = rid;
    ctx.connection = &stream;
    if (body) ctx.body = &*body;
    const auto started = std::chrono::steady_clock::now();
    // Handlers may stream for a long time (SSE): no read deadline while they run.
    stream.expires_never();
    std::optional<Response> res;
    bool keep = true;
    unsigned status = 0;
    try {
      res = co_await handler_(ctx);
    } catch (const std::exception& e) {
      // Our handlers do not throw; this is the last line of defence for library exceptions.
      SBX_LOG_ERROR(ctx.log, "request {} {}: handler threw: {}", Sv(req.method_string()),
                    LoggedPath(Sv(req.target())), e.what());
      if (!chunked.began()) {
        res = errors_(bhttp::status::internal_server_error, "internal", "internal error", rid);
      } else {
        keep = false;
      }
    }
    if (ctx.taken_status != 0) {
      // The handler owned the connection (WebSocket): nothing of HTTP is left on it.
      requests_.Count(req.method(), ctx.taken_status);
      LogAccess(ctx.log, Sv(req.method_string()), Sv(req.target()), ctx.taken_status,
                MsSince(started));
      break;
    }
    if (res) {
      res->version(req.version());
      res->keep_alive(res->keep_alive() && req.keep_alive());
      res->set("X-Request-Id", rid);
      status = res->result_int();
      keep = co_await send(std::move(*res), req.method());
    } else {
      status = chunked.status();
      keep = keep && chunked.reusable();
    }
    if (body && !body->done() && keep) {
      // The handler answered before taking the whole body (an error): read the rest, bounded,
      // so that the client, which sends it all before reading, gets the answer instead of a
      // broken pipe. Past the bound the connection closes.
      std::vector<char> sink(64 << 10);
      uint64_t drained = 0;
      while (!body->done() && drained < (uint64_t{256} << 20)) {
        auto n = co_await body->ReadSome(sink.data(), sink.size());
        if (!n.ok() || *n == 0) break;
        drained += *n;
      }
      keep = body->done();
    }
    LogAccess(ctx.log, Sv(req.method_string()), Sv(req.target()), status, MsSince(started));
    if (!keep) break;
  }
  boost::system::error_code ec;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  stream.close();
}

}  // namespace sbx::http
