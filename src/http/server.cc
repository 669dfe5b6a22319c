#include "http/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <sstream>

#include "common/ids.h"
#include "common/unique_fd.h"
#include "http/connection.h"

namespace sbx::http {
namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

bool PrintableId(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
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

namespace {

// One context per thread, each told it has one thread (asio then never wakes another).
std::vector<std::unique_ptr<asio::io_context>> MakeContexts(int threads) {
  std::vector<std::unique_ptr<asio::io_context>> out;
  for (int i = 0; i < std::max(1, threads); ++i) {
    out.push_back(std::make_unique<asio::io_context>(1));
  }
  return out;
}

}  // namespace

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
      iocs_(MakeContexts(opts_.threads)),
      acceptor_(*iocs_.front()),
      tls_enabled_(opts_.tls != nullptr),
      tls_(std::move(opts_.tls)) {}

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
  // asio opens without SOCK_CLOEXEC: a program sbxd starts must not inherit the listener.
  if (!ec && !SetCloseOnExec(acceptor_.native_handle())) {
    ec = boost::system::error_code(errno, boost::system::system_category());
  }
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

absl::Status Server::SetTls(std::shared_ptr<asio::ssl::context> tls) {
  if (!tls_enabled_ || tls == nullptr) {
    return absl::FailedPreconditionError(
        "TLS: the listener's scheme (http or https) changes only with a restart");
  }
  std::lock_guard lock(tls_mu_);
  tls_ = std::move(tls);
  return absl::OkStatus();
}

void Server::Start() {
  asio::co_spawn(*iocs_.front(), AcceptLoop(), asio::detached);
  for (auto& ioc : iocs_) {
    work_.push_back(asio::make_work_guard(*ioc));
    threads_.emplace_back([io = ioc.get()] { io->run(); });
  }
}

asio::io_context& Server::NextContext() {
  return *iocs_[next_ioc_.fetch_add(1, std::memory_order_relaxed) % iocs_.size()];
}

void Server::Stop() {
  if (stopped_.exchange(true)) return;
  asio::post(*iocs_.front(), [this] {
    boost::system::error_code ec;
    acceptor_.close(ec);
  });
  work_.clear();
  for (auto& ioc : iocs_) ioc->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

metrics::Counter& Server::Rejected(std::string_view reason) {
  if (reason == ConnectionTable::kMaxPerAddress) return rejected_per_ip_;
  if (reason == ConnectionTable::kOpenFiles) return rejected_fds_;
  return rejected_max_;
}

void Server::Refuse(asio::ip::tcp::socket socket, std::string_view reason, bool drain) {
  Rejected(reason).Inc();
  boost::system::error_code ec;
  if (tls_enabled_) {
    // A plain-text 503 means nothing to a TLS client, and a handshake first would spend the
    // CPU that shedding saves: the connection just closes.
    socket.close(ec);
    return;
  }
  requests_.Count(bhttp::verb::unknown, 503);
  std::ostringstream out;
  out << UnavailableResponse(errors_, NewId("req"));
  const std::string bytes = out.str();
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
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(NextContext()), kTuple);
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
    // Accepted without SOCK_CLOEXEC (asio uses accept(2)): a program sbxd starts must not
    // hold a client's connection open. Every program is also started with closefrom(3); this
    // covers a start that races the accept.
    (void)SetCloseOnExec(socket.native_handle());
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
  asio::ip::tcp::socket socket(asio::make_strand(NextContext()));
  const auto protocol = acceptor_.local_endpoint(ec).protocol();
  if (!ec) socket.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    spares_.Refill();
    co_return;
  }
  const auto peer = socket.remote_endpoint(ec);
  // Descriptors may have come back while this accept waited (connections closed, the limit was
  // raised): with every spare held again the pressure is over, and this is an ordinary
  // connection, not one for the reserve (it got a 503 right after the pressure ended).
  spares_.Refill();
  const bool recovered = !ec && spares_.full();
  ConnectionTable::Lease lease;
  if (recovered) {
    lease = connections_.Admit(peer.address());
  } else if (!ec && spares_.held() > 0) {  // the last spare stays for the next refusal
    lease = connections_.AdmitReserve(peer.address(), ConnectionTable::kOpenFiles);
  }
  if (lease.slot() == ConnectionTable::Slot::kRefused) {
    // No drain while descriptors are what is short.
    Refuse(std::move(socket), recovered ? lease.reason() : ConnectionTable::kOpenFiles,
           /*drain=*/recovered);
    spares_.Refill();
    co_return;
  }
  auto ex = socket.get_executor();
  asio::co_spawn(ex, Serve(std::move(socket), std::move(lease)), asio::detached);
}

asio::awaitable<void> Server::Serve(asio::ip::tcp::socket socket, ConnectionTable::Lease lease) {
  std::shared_ptr<asio::ssl::context> tls;
  if (tls_enabled_) {
    std::lock_guard lock(tls_mu_);
    tls = tls_;
  }
  Connection connection(ConnectionEnv{opts_, requests_, handler_, errors_}, std::move(socket),
                        std::move(tls), lease.slot() == ConnectionTable::Slot::kReserve,
                        Rejected(lease.reason()));
  co_await connection.Run();
  spares_.Refill();
}

}  // namespace sbx::http
