#include "http/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <cerrno>
#include <sstream>

#include "common/ids.h"
#include "common/status_util.h"
#include "http/framing.h"

namespace sbx::http {
namespace {

using asio::use_awaitable;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

class ChunkedStream : public ResponseStream {
 public:
  // `last`: the connection closes after this response (a reserve slot): the header says so.
  ChunkedStream(beast::tcp_stream& stream, std::chrono::seconds write_timeout,
                RequestCounter& requests, bhttp::verb method, bool last)
      : stream_(stream),
        write_timeout_(write_timeout),
        requests_(requests),
        method_(method),
        last_(last) {}

  asio::awaitable<bool> Begin(bhttp::response_header<> header) override {
    status_ = header.result_int();
    requests_.Count(method_, header.result_int());
    bhttp::response<bhttp::empty_body> res{std::move(header)};
    if (last_) res.keep_alive(false);
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
  bool last_;
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


// ---------------------------------------------------------------------------------------------

namespace {

// What one read asks for; the read buffer holds one header block and one read.
constexpr size_t kReadChunk = 64 << 10;
// Refused connections whose 503 is followed by a short drain, at most; past that they are
// closed at once (each holds a descriptor outside the connection caps).
constexpr int kMaxDraining = 64;
// Warnings about the caps and the fd limit: at most one line per period, with a count of what
// it held back (the battery saw "accept: Too many open files" every 50 ms).
constexpr auto kLogEvery = std::chrono::seconds(10);

bool LogDue(std::chrono::steady_clock::time_point& at, uint64_t& held, uint64_t& report) {
  const auto now = std::chrono::steady_clock::now();
  if (at != std::chrono::steady_clock::time_point{} && now - at < kLogEvery) {
    ++held;
    return false;
  }
  at = now;
  report = held;
  held = 0;
  return true;
}

metrics::Registry& RegistryOf(const ServerOptions& o) {
  return o.metrics != nullptr ? *o.metrics : metrics::Default();
}

}  // namespace

SpareFds::SpareFds(size_t target) : target_(target) { Refill(); }

SpareFds::~SpareFds() {
  for (int fd : fds_) ::close(fd);
}

bool SpareFds::GiveUp() {
  std::lock_guard lock(mu_);
  if (fds_.empty()) return false;
  ::close(fds_.back());
  fds_.pop_back();
  held_.store(fds_.size(), std::memory_order_relaxed);
  return true;
}

void SpareFds::Refill() {
  if (held_.load(std::memory_order_relaxed) >= target_) return;
  std::lock_guard lock(mu_);
  while (fds_.size() < target_) {
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    fds_.push_back(fd);
  }
  held_.store(fds_.size(), std::memory_order_relaxed);
}

Server::Server(ServerOptions opts, Handler handler, ErrorResponder errors)
    : opts_(std::move(opts)),
      requests_(RegistryOf(opts_)),
      handler_(std::move(handler)),
      errors_(std::move(errors)),
      rejected_family_(RegistryOf(opts_).AddCounter(
          "sbx_http_connections_rejected_total",
          "Connections turned away with 503 because a connection cap or the fd limit was "
          "reached (a reserve slot's non-privileged request included), by reason.",
          {"reason"})),
      rejected_max_(rejected_family_.WithLabels({ConnectionTable::kMaxConnections})),
      rejected_per_ip_(rejected_family_.WithLabels({ConnectionTable::kMaxPerAddress})),
      rejected_fds_(rejected_family_.WithLabels({ConnectionTable::kOpenFiles})),
      connections_(opts_.max_connections, opts_.max_connections_per_ip,
                   opts_.reserved_connections,
                   &RegistryOf(opts_)
                        .AddGauge("sbx_http_connections",
                                  "Client connections open, reserve slots included.")
                        .WithLabels()),
      spares_(opts_.reserved_connections + 1),
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

metrics::Counter& Server::Rejected(std::string_view reason) {
  if (reason == ConnectionTable::kMaxPerAddress) return rejected_per_ip_;
  if (reason == ConnectionTable::kOpenFiles) return rejected_fds_;
  return rejected_max_;
}

Response Server::Unavailable(const std::string& request_id) const {
  Response res = errors_(bhttp::status::service_unavailable, "unavailable",
                         "sbxd is at its connection limit; retry later", request_id);
  res.set(bhttp::field::retry_after, "5");
  res.keep_alive(false);
  res.prepare_payload();
  return res;
}

void Server::Refuse(asio::ip::tcp::socket socket, std::string_view reason, bool drain) {
  Rejected(reason).Inc();
  requests_.Count(bhttp::verb::unknown, 503);
  std::ostringstream out;
  out << Unavailable(NewId("req"));
  const std::string bytes = out.str();
  boost::system::error_code ec;
  // A fresh socket's send buffer is empty: the response fits, and the call never blocks.
  socket.non_blocking(true, ec);
  socket.send(asio::buffer(bytes), 0, ec);
  socket.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  if (drain) {
    if (draining_.fetch_add(1) < kMaxDraining) {
      auto ex = socket.get_executor();
      asio::co_spawn(ex, DrainAndClose(std::move(socket)), asio::detached);
      return;
    }
    draining_.fetch_sub(1);
  }
  socket.close(ec);
}

asio::awaitable<void> Server::DrainAndClose(asio::ip::tcp::socket socket) {
  // Closing with the client's request unread would send a reset, which can destroy the 503 in
  // the client's receive queue before it is read.
  beast::tcp_stream stream(std::move(socket));
  stream.expires_after(std::chrono::seconds(1));
  std::array<char, 4096> sink;
  size_t drained = 0;
  while (drained < (64u << 10)) {
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(sink), kTuple);
    if (ec) break;
    drained += n;
  }
  stream.close();
  draining_.fetch_sub(1);
}

asio::awaitable<void> Server::AcceptLoop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(ioc_), kTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || stopped_) co_return;
      if (ec == asio::error::no_descriptors ||
          ec == boost::system::errc::too_many_files_open_in_system) {
        co_await ShedAtFdLimit();
        continue;
      }
      // ENOBUFS, ENOMEM, ...: nothing to shed; back off briefly, and say so now and then.
      if (uint64_t n = 0; LogDue(accept_log_at_, accept_log_held_, n)) {
        spdlog::warn("accept: {} ({} more since the last report)", ec.message(), n);
      }
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    boost::system::error_code oec;
    socket.set_option(asio::ip::tcp::no_delay(true), oec);
    const auto peer = socket.remote_endpoint(oec);
    if (oec) continue;  // already gone
    ConnectionTable::Lease lease = connections_.Admit(peer.address());
    if (lease.slot() != ConnectionTable::Slot::kNormal) {
      if (uint64_t n = 0; LogDue(cap_log_at_, cap_log_held_, n)) {
        spdlog::warn(
            "HTTP connection limit reached ({}; {} open, {} in the reserve): new connections "
            "get /healthz and the admin token only, the rest 503 ({} more since the last "
            "report)",
            lease.reason(), connections_.open(), connections_.reserve_in_use(), n);
      }
    }
    if (lease.slot() == ConnectionTable::Slot::kRefused) {
      Refuse(std::move(socket), lease.reason(), /*drain=*/true);
      continue;
    }
    auto ex = socket.get_executor();
    asio::co_spawn(ex, Serve(std::move(socket), std::move(lease)), asio::detached);
  }
}

asio::awaitable<void> Server::ShedAtFdLimit() {
  if (uint64_t n = 0; LogDue(fd_log_at_, fd_log_held_, n)) {
    spdlog::warn(
        "accept: Too many open files: {} spare descriptors left for /healthz and the admin "
        "token, other connections get 503 ({} more since the last report)",
        spares_.held(), n);
  }
  auto executor = co_await asio::this_coro::executor;
  auto back_off = [&]() -> asio::awaitable<void> {
    // Nothing could be taken: wait for descriptors to come back instead of failing again at
    // once.
    asio::steady_timer t(executor, std::chrono::milliseconds(100));
    co_await t.async_wait(kTuple);
    spares_.Refill();
  };
  if (!spares_.GiveUp()) {
    co_await back_off();
    co_return;
  }
  const int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    spares_.Refill();
    // EAGAIN: the connection went away; anything else (EMFILE again: another thread took the
    // descriptor) waits.
    if (err != EAGAIN && err != EWOULDBLOCK) co_await back_off();
    co_return;
  }
  boost::system::error_code ec;
  asio::ip::tcp::socket socket(asio::make_strand(ioc_));
  const auto protocol = acceptor_.local_endpoint(ec).protocol();
  if (!ec) socket.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    spares_.Refill();
    co_return;
  }
  const auto peer = socket.remote_endpoint(ec);
  ConnectionTable::Lease lease;
  // The last spare stays for the next refusal.
  if (!ec && spares_.held() > 0) {
    lease = connections_.AdmitReserve(peer.address(), ConnectionTable::kOpenFiles);
  }
  if (lease.slot() != ConnectionTable::Slot::kReserve) {
    // No drain: descriptors are what is short.
    Refuse(std::move(socket), ConnectionTable::kOpenFiles, /*drain=*/false);
    spares_.Refill();
    co_return;
  }
  auto ex = socket.get_executor();
  asio::co_spawn(ex, Serve(std::move(socket), std::move(lease)), asio::detached);
}

asio::awaitable<void> Server::Serve(asio::ip::tcp::socket socket, ConnectionTable::Lease lease) {
  using namespace asio::experimental::awaitable_operators;
  beast::tcp_stream stream(std::move(socket));
  // Bounded: one header block plus one read. Beast keeps a chunk's size line and the trailer
  // here until each is complete, so this bound also ends an endless chunk extension.
  beast::flat_buffer buffer(opts_.max_header_bytes + kReadChunk);
  auto executor = co_await asio::this_coro::executor;
  // The deadline of a header and of a buffered body. Ours, not the stream's: the stream's timer
  // closes the socket when it fires, and then no 408 can go out.
  asio::steady_timer deadline(executor);
  const bool reserve = lease.slot() == ConnectionTable::Slot::kReserve;
  const size_t ext_limit = opts_.max_chunk_extension_bytes;
  auto check_chunk_header = [ext_limit](std::uint64_t, beast::string_view ext,
                                        beast::error_code& ec) {
    if (ext.size() > ext_limit) ec = bhttp::error::bad_chunk_extension;
  };

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

  // One read into `buffer`, given up at `deadline`.
  auto read_some = [&]() -> asio::awaitable<beast::error_code> {
    const size_t room = std::min(kReadChunk, buffer.max_size() - buffer.size());
    if (room == 0) co_return bhttp::error::buffer_overflow;
    auto r = co_await (stream.socket().async_read_some(buffer.prepare(room), kTuple) ||
                       deadline.async_wait(kTuple));
    if (r.index() == 1) co_return beast::error::timeout;
    auto [ec, n] = std::get<0>(r);
    buffer.commit(n);
    co_return ec;
  };

  // Reads until the buffer starts with a whole header block; returns its length. A keep-alive
  // connection waits for the next request's first byte with the idle timeout; the header is
  // then due within header_timeout of it (for the first request: of the accept).
  auto read_header = [&](bool first) -> asio::awaitable<std::pair<beast::error_code, size_t>> {
    if (!first) {
      if (buffer.size() == 0) {
        deadline.expires_after(opts_.idle_timeout);
        if (auto ec = co_await read_some()) co_return std::pair{ec, size_t{0}};
      }
      deadline.expires_after(opts_.header_timeout);
    }
    size_t searched = 0;
    for (;;) {
      const std::string_view data(static_cast<const char*>(buffer.data().data()),
                                  buffer.size());
      // RFC 9112 §2.2: empty lines before a request line are ignored.
      size_t empty = 0;
      while (data.substr(empty, 2) == "\r\n") empty += 2;
      if (empty > 0) {
        buffer.consume(empty);
        searched = 0;
        continue;
      }
      const size_t end = HeaderBlockEnd(data, searched);
      if (end != std::string_view::npos) {
        if (end > opts_.max_header_bytes) {
          co_return std::pair{beast::error_code(bhttp::error::header_limit), size_t{0}};
        }
        co_return std::pair{beast::error_code{}, end};
      }
      if (data.size() >= opts_.max_header_bytes) {
        co_return std::pair{beast::error_code(bhttp::error::header_limit), size_t{0}};
      }
      searched = data.size();
      if (auto ec = co_await read_some()) co_return std::pair{ec, size_t{0}};
    }
  };

  // Sends `res` as the last response and ends the connection: nothing after a request the
  // server refused can be trusted to be framed as the client meant. `drain` bytes (and at
  // most `drain_time`) of what the client still sends are read and discarded first: a client
  // blocked writing a large body would otherwise get a reset instead of the answer.
  auto refuse = [&](Response res, bhttp::verb verb, std::string_view method,
                    std::string_view target, std::chrono::steady_clock::time_point started,
                    size_t drain, std::chrono::seconds drain_time) -> asio::awaitable<void> {
    log::Context lctx;
    lctx.request_id = std::string(Sv(res["X-Request-Id"]));
    const unsigned status = res.result_int();
    co_await send(std::move(res), verb, /*last=*/true);
    LogAccess(lctx, method, target, status, MsSince(started));
    if (drain == 0) co_return;
    boost::system::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    stream.expires_after(drain_time);
    size_t drained = 0;
    std::vector<char> sink(64 << 10);
    while (drained < drain) {
      auto [dec, dn] = co_await stream.async_read_some(asio::buffer(sink), kTuple);
      if (dec) break;
      drained += dn;
    }
  };
  constexpr size_t kDrainBad = 16u << 20;
  constexpr size_t kDrainShed = 1u << 20;

  // The first request's header is due within header_timeout of the accept.
  deadline.expires_after(opts_.header_timeout);
  for (bool first = true;; first = false) {
    // A write's deadline left from the last response must not cut a read short.
    stream.expires_never();
    auto [rec, block] = co_await read_header(first);
    const auto started = std::chrono::steady_clock::now();
    if (rec) {
      if (rec == bhttp::error::header_limit) {
        co_await refuse(errors_(bhttp::status::request_header_fields_too_large,
                                "invalid_argument", "request headers are too large",
                                NewId("req")),
                        bhttp::verb::unknown, "-", "-", started, kDrainBad,
                        std::chrono::seconds(2));
      } else if (rec == beast::error::timeout && buffer.size() > 0) {
        // Part of a request came, too slowly (slowloris). A silent connection just closes.
        co_await refuse(errors_(bhttp::status::request_timeout, "request_timeout",
                                "the request header did not arrive in time", NewId("req")),
                        bhttp::verb::unknown, "-", "-", started, 0, {});
      }
      break;
    }

    bhttp::request_parser<bhttp::string_body> parser;
    // The body limit depends on the route (an upload that streams may be large), which is
    // known only once the header is in: Content-Length is checked by hand below, and the
    // parser's limit (for chunked bodies) set then.
    parser.body_limit(boost::none);
    parser.header_limit(static_cast<uint32_t>(opts_.max_header_bytes));
    parser.on_chunk_header(check_chunk_header);
    std::optional<FramingError> bad;
    {
      const std::string_view raw(static_cast<const char*>(buffer.data().data()), block);
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
    buffer.consume(block);
    if (!bad) bad = CheckFraming(parser.get());
    std::string method = "-", target = "-";
    bhttp::verb verb = bhttp::verb::unknown;
    if (parser.is_header_done()) {
      method = std::string(Sv(parser.get().method_string()));
      target = std::string(Sv(parser.get().target()));
      verb = parser.get().method();
    }
    if (bad) {
      const std::string rid = parser.is_header_done() ? RequestIdFor(parser.get()) : NewId("req");
      const std::string_view code =
          bad->status == bhttp::status::not_implemented ? "not_implemented" : "invalid_argument";
      co_await refuse(errors_(bad->status, code, bad->message, rid), verb, method, target,
                      started, kDrainBad, std::chrono::seconds(2));
      break;
    }
    if (reserve && !(opts_.privileged && opts_.privileged(parser.get()))) {
      Rejected(lease.reason()).Inc();
      co_await refuse(Unavailable(RequestIdFor(parser.get())), verb, method, target, started,
                      kDrainShed, std::chrono::seconds(1));
      break;
    }

    // A route that streams its body: the handler reads it (StreamedBody) after this parser
    // hands over what it knows of the framing.
    std::optional<bhttp::request_parser<bhttp::buffer_body>> streamed;
    const bool stream_it =
        !parser.is_done() && opts_.stream_body && opts_.stream_body(parser.get());
    const uint64_t body_limit = stream_it ? opts_.max_streamed_body_bytes : opts_.max_body_bytes;
    beast::error_code bec;
    if (parser.content_length() && *parser.content_length() > body_limit) {
      bec = bhttp::error::body_limit;
    }
    if (!bec) parser.body_limit(body_limit);
    if (!bec && stream_it) {
      streamed.emplace(std::move(parser));
      streamed->body_limit(body_limit);
      streamed->on_chunk_header(check_chunk_header);
    } else if (!bec && !parser.is_done()) {
      deadline.expires_after(opts_.read_timeout);
      auto r = co_await (bhttp::async_read(stream, buffer, parser, kTuple) ||
                         deadline.async_wait(kTuple));
      bec = r.index() == 1 ? beast::error_code(beast::error::timeout)
                           : std::get<0>(std::get<0>(r));
    }
    if (bec) {
      if (bec == bhttp::error::end_of_stream || bec == asio::error::eof ||
          bec == asio::error::connection_reset || bec == asio::error::operation_aborted) {
        break;
      }
      const std::string rid = RequestIdFor(parser.get());
      if (bec == beast::error::timeout) {
        co_await refuse(errors_(bhttp::status::request_timeout, "request_timeout",
                                "the request body did not arrive in time", rid),
                        verb, method, target, started, 0, {});
      } else if (bec == bhttp::error::body_limit) {
        co_await refuse(errors_(bhttp::status::payload_too_large, "payload_too_large",
                                fmt::format("request body is larger than {} bytes", body_limit),
                                rid),
                        verb, method, target, started, kDrainBad, std::chrono::seconds(2));
      } else if (bec == bhttp::error::buffer_overflow) {
        co_await refuse(
            errors_(bhttp::status::bad_request, "invalid_argument",
                    fmt::format("malformed HTTP request: a chunk header or trailer is longer "
                                "than {} bytes",
                                buffer.max_size()),
                    rid),
            verb, method, target, started, kDrainBad, std::chrono::seconds(2));
      } else if (bec == bhttp::error::bad_chunk_extension) {
        co_await refuse(
            errors_(bhttp::status::bad_request, "invalid_argument",
                    fmt::format("malformed HTTP request: a chunk extension is malformed or "
                                "longer than {} bytes",
                                ext_limit),
                    rid),
            verb, method, target, started, kDrainBad, std::chrono::seconds(2));
      } else {
        co_await refuse(errors_(bhttp::status::bad_request, "invalid_argument",
                                fmt::format("malformed HTTP request: {}", bec.message()), rid),
                        verb, method, target, started, kDrainBad, std::chrono::seconds(2));
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
    // A reserve slot serves one request: the next client may need it.
    ChunkedStream chunked(stream, opts_.write_timeout, requests_, req.method(),
                          /*last=*/reserve);
    RequestContext ctx{req, rid, chunked, executor};
    ctx.log.request_id = rid;
    ctx.connection = &stream;
    if (body) ctx.body = &*body;
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
      // Decided before the version is set: an HTTP/1.0 response without a Connection header
      // reads as "close", which made every 1.0 keep-alive request the connection's last.
      const bool keep_alive = res->keep_alive() && req.keep_alive() && !reserve;
      res->version(req.version());
      res->keep_alive(keep_alive);
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
  spares_.Refill();
}

}  // namespace sbx::http
