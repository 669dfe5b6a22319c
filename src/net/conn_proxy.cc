#include "net/conn_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "common/status_util.h"
#include <spdlog/spdlog.h>
#include "net/nft_ruleset.h"

namespace sbx::net {
namespace {

using Clock = std::chrono::steady_clock;

// SO_ORIGINAL_DST (linux/netfilter_ipv4.h) and IP6T_SO_ORIGINAL_DST
// (linux/netfilter_ipv6/ip6_tables.h): both 80; the kernel headers clash with glibc's.
constexpr int kSoOriginalDst = 80;
constexpr int kMaxEvents = 64;
constexpr int kSplicesPerWakeup = 16;  // then the next ready connection gets its turn
constexpr size_t kSpliceChunk = 1 << 20;

struct Sockaddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
};

Sockaddr ToSockaddr(const IpPrefix& a, uint16_t port) {
  Sockaddr s;
  if (a.is_v4()) {
    auto* in = reinterpret_cast<sockaddr_in*>(&s.ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    std::memcpy(&in->sin_addr, a.addr.data(), 4);
    s.len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&s.ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    std::memcpy(&in6->sin6_addr, a.addr.data(), 16);
    s.len = sizeof(sockaddr_in6);
  }
  return s;
}

std::optional<std::pair<IpPrefix, uint16_t>> FromSockaddr(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    return std::make_pair(IpPrefix::Host(AF_INET, reinterpret_cast<const uint8_t*>(&in->sin_addr)),
                          ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    // A v4-mapped peer on a dual-stack socket: its IPv4 address (the v6 listener is V6ONLY,
    // so this is only belt and braces).
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      return std::make_pair(IpPrefix::Host(AF_INET, in6->sin6_addr.s6_addr + 12), ntohs(in6->sin6_port));
    }
    return std::make_pair(IpPrefix::Host(AF_INET6, in6->sin6_addr.s6_addr), ntohs(in6->sin6_port));
  }
  return std::nullopt;
}

// A reset instead of a FIN: the client sees ECONNRESET, as from a refused connection.
void CloseWithReset(int fd) {
  if (fd < 0) return;
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

}  // namespace

absl::StatusOr<std::pair<IpPrefix, uint16_t>> OriginalDestination(int fd, int family) {
  sockaddr_storage ss{};
  socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  int level = family == AF_INET ? SOL_IP : SOL_IPV6;
  if (getsockopt(fd, level, kSoOriginalDst, &ss, &len) != 0) {
    return ErrnoStatus(errno, fmt::format("proxy: getsockopt({}, {})", fd,
                                          family == AF_INET ? "SO_ORIGINAL_DST" : "IP6T_SO_ORIGINAL_DST"));
  }
  auto r = FromSockaddr(ss);
  if (!r) return absl::InternalError("proxy: original destination of an unknown family");
  return *r;
}

// One connection. Owned by the loop thread; the registry (under mu) holds what other threads
// read, and its fds, which only the loop closes, with mu held, after removing the entry.
struct Conn {
  enum class State { kPeek, kConnecting, kRelay };
  uint64_t serial = 0;
  State state = State::kPeek;
  int client = -1, upstream = -1;
  int family = AF_INET;
  ProxiedConnection info;
  Clock::time_point deadline;  // peek or connect deadline; then the idle one
  size_t peeked = 0;
  // Per direction (0: client -> upstream, 1: upstream -> client): pipe, bytes in it, EOF seen.
  int pipe_r[2] = {-1, -1}, pipe_w[2] = {-1, -1};
  size_t in_pipe[2] = {0, 0};
  // The pipe took no more from the source while holding bytes: it is full (a pipe holds a
  // number of pages, not of bytes), and reading waits until some went out.
  bool pipe_full[2] = {false, false};
  bool eof[2] = {false, false}, shut[2] = {false, false};
  uint32_t ev_client = 0, ev_upstream = 0;  // epoll interest now registered
  std::atomic<bool> cut{false};  // set by CutDisallowed/CloseAll (other threads)
};

// epoll's data: which connection and which of its sockets (the low bit).
struct ConnProxy::Impl {
  ProxyOptions opts;
  ProxyHooks hooks;
  int epfd = -1, wake = -1;
  std::vector<int> listeners;
  std::atomic<bool> stopping{false};

  std::mutex mu;  // guards conns' registry fields read by other threads, and every close
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::map<std::string, size_t> per_sandbox;
  uint64_t next_serial = 2;  // even: the low bit of epoll's data says which socket

  ~Impl() {
    for (int fd : listeners) close(fd);
    if (wake >= 0) close(wake);
    if (epfd >= 0) close(epfd);
  }

  void Run();
  void Accept(int lfd);
  void Admit(int fd);
  void OnEvent(uint64_t data, uint32_t events);
  void Peek(Conn& c, uint32_t events);
  void Connect(Conn& c);
  void Connected(Conn& c);
  void Pump(Conn& c);
  void Arm(Conn& c);
  void Sweep();
  void Close(uint64_t serial, bool reset);
  void Refuse(Conn& c, const std::string& reason) {
    if (hooks.deny) hooks.deny(c.info.id, reason, c.info.dest, c.info.name, c.info.port);
    Close(c.serial, true);
  }
};

absl::StatusOr<std::unique_ptr<ConnProxy>> ConnProxy::Start(ProxyOptions opts, ProxyHooks hooks) {
  std::unique_ptr<ConnProxy> p(new ConnProxy());
  p->impl_ = std::make_unique<Impl>();
  Impl& im = *p->impl_;
  im.opts = opts;
  im.hooks = std::move(hooks);
  if (!im.hooks.original_dst) {
    im.hooks.original_dst = [](int fd) -> absl::StatusOr<std::pair<IpPrefix, uint16_t>> {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        return ErrnoStatus(errno, "proxy: getsockname");
      }
      return OriginalDestination(fd, ss.ss_family);
    };
  }
  im.epfd = epoll_create1(EPOLL_CLOEXEC);
  if (im.epfd < 0) return ErrnoStatus(errno, "proxy: epoll_create1");
  im.wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (im.wake < 0) return ErrnoStatus(errno, "proxy: eventfd");
  epoll_event wev{EPOLLIN, {.u64 = 0}};
  if (epoll_ctl(im.epfd, EPOLL_CTL_ADD, im.wake, &wev) != 0) return ErrnoStatus(errno, "proxy: epoll_ctl(eventfd)");
  uint16_t port = opts.port;
  for (int family : {AF_INET, AF_INET6}) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoStatus(errno, "proxy: socket");
    im.listeners.push_back(fd);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    IpPrefix any;
    any.family = family;
    if (opts.loopback_only) any.addr[family == AF_INET ? 0 : 15] = family == AF_INET ? 127 : 1;
    if (opts.loopback_only && family == AF_INET) any.addr[3] = 1;
    Sockaddr sa = ToSockaddr(any, port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa.ss), sa.len) != 0) {
      return ErrnoStatus(errno, fmt::format("proxy: bind(port {}, {})", port, family == AF_INET ? "IPv4" : "IPv6"));
    }
    if (listen(fd, 1024) != 0) return ErrnoStatus(errno, "proxy: listen");
    if (port == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      port = FromSockaddr(ss)->second;
    }
    // Listeners are tagged with serial 1 (odd, never a connection) and their fd above.
    epoll_event ev{EPOLLIN, {.u64 = (static_cast<uint64_t>(fd) << 32) | 1}};
    if (epoll_ctl(im.epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return ErrnoStatus(errno, "proxy: epoll_ctl(listener)");
  }
  p->port_ = port;
  p->thread_ = std::thread([&im] { im.Run(); });
  return p;
}

ConnProxy::~ConnProxy() { Stop(); }

void ConnProxy::Stop() {
  if (!impl_) return;
  impl_->stopping = true;
  uint64_t one = 1;
  (void)!write(impl_->wake, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  std::vector<uint64_t> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& [s, c] : impl_->conns) all.push_back(s);
  }
  for (uint64_t s : all) impl_->Close(s, true);
  impl_.reset();
}

size_t ConnProxy::CutDisallowed(const std::string& id, const EffectiveRules& rules) {
  size_t n = 0;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& [s, c] : impl_->conns) {
    if (c->info.id != id || c->state == Conn::State::kPeek || c->cut) continue;
    if (StillAllowed(rules, c->info.name, c->info.dest, c->info.port)) continue;
    // The sockets stop carrying data now; the loop sees the shutdown and closes them.
    c->cut = true;
    shutdown(c->client, SHUT_RDWR);
    if (c->upstream >= 0) shutdown(c->upstream, SHUT_RDWR);
    ++n;
  }
  if (n > 0) {
    uint64_t one = 1;
    (void)!write(impl_->wake, &one, sizeof(one));
  }
  return n;
}

size_t ConnProxy::CloseAll(const std::string& id) {
  size_t n = 0;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& [s, c] : impl_->conns) {
    if (c->info.id != id || c->cut) continue;
    c->cut = true;
    shutdown(c->client, SHUT_RDWR);
    if (c->upstream >= 0) shutdown(c->upstream, SHUT_RDWR);
    ++n;
  }
  uint64_t one = 1;
  (void)!write(impl_->wake, &one, sizeof(one));
  return n;
}

std::vector<ProxiedConnection> ConnProxy::Connections(const std::string& id) {
  std::vector<ProxiedConnection> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [s, c] : impl_->conns) {
    if (c->info.id == id && c->state == Conn::State::kRelay && !c->cut) out.push_back(c->info);
  }
  return out;
}

size_t ConnProxy::Count() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->conns.size();
}

void ConnProxy::Impl::Run() {
  epoll_event evs[kMaxEvents];
  auto last_sweep = Clock::now();
  while (!stopping) {
    int n = epoll_wait(epfd, evs, kMaxEvents, 1000);
    if (n < 0 && errno != EINTR) {
      spdlog::error("proxy: epoll_wait: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t data = evs[i].data.u64;
      if (data == 0) {
        uint64_t v;
        (void)!read(wake, &v, sizeof(v));
        continue;
      }
      if ((data & 0xffffffff) == 1) {
        Accept(static_cast<int>(data >> 32));
        continue;
      }
      OnEvent(data, evs[i].events);
    }
    if (Clock::now() - last_sweep >= std::chrono::seconds(1) || n == 0) {
      Sweep();
      last_sweep = Clock::now();
    }
  }
}

void ConnProxy::Impl::Accept(int lfd) {
  for (int i = 0; i < 64; ++i) {
    int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED && errno != EINTR) {
        spdlog::warn("proxy: accept4: {}", std::strerror(errno));
      }
      return;
    }
    Admit(fd);
  }
}

// Steps 1-3 up to the peek (conn_proxy.h).
void ConnProxy::Impl::Admit(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    CloseWithReset(fd);
    return;
  }
  auto peer = FromSockaddr(ss);
  std::optional<std::string> id = peer ? hooks.id_of_address(peer->first) : std::nullopt;
  if (!id) {
    CloseWithReset(fd);
    return;
  }
  auto dst = hooks.original_dst(fd);
  if (!dst.ok()) {
    spdlog::warn("proxy: sandbox {}: {}", *id, std::string(dst.status().message()));
    CloseWithReset(fd);
    return;
  }
  auto c = std::make_unique<Conn>();
  c->client = fd;
  c->family = dst->first.family;
  c->info.id = *id;
  c->info.dest = dst->first;
  c->info.port = dst->second;
  c->deadline = Clock::now() + kPeekTimeout;
  {
    std::lock_guard<std::mutex> lock(mu);
    size_t& mine = per_sandbox[*id];
    if (mine >= kProxyMaxPerSandbox || conns.size() >= kProxyMaxTotal) {
      if (mine == 0) per_sandbox.erase(*id);
      CloseWithReset(fd);
      return;
    }
    ++mine;
    c->serial = next_serial;
    next_serial += 2;
    conns.emplace(c->serial, std::move(c));
  }
  Conn& conn = *conns.at(next_serial - 2);  // only this thread inserts or erases
  if (auto why = hooks.forbidden(conn.info.dest)) return Refuse(conn, *why);
  std::optional<EffectiveRules> rules = hooks.rules_of(conn.info.id);
  if (!rules) return Close(conn.serial, true);
  switch (JudgeCidr(*rules, conn.info.dest, conn.info.port)) {
    case CidrVerdict::kDenied:
      return Refuse(conn, kReasonDenyRule);
    case CidrVerdict::kAllowed:
      return Connect(conn);
    case CidrVerdict::kNone:
      break;
  }
  Arm(conn);
}

void ConnProxy::Impl::OnEvent(uint64_t data, uint32_t events) {
  uint64_t serial = data & ~uint64_t{1};
  auto it = conns.find(serial);
  if (it == conns.end()) return;
  Conn& c = *it->second;
  if (c.cut) return Close(serial, true);
  if (events & EPOLLERR) return Close(serial, true);
  switch (c.state) {
    case Conn::State::kPeek:
      return Peek(c, events);
    case Conn::State::kConnecting:
      return Connected(c);
    case Conn::State::kRelay:
      return Pump(c);
  }
}

void ConnProxy::Impl::Peek(Conn& c, uint32_t events) {
  char buf[kPeekLimit];
  ssize_t n = recv(c.client, buf, sizeof(buf), MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) return Close(c.serial, true);  // closed or reset before naming anything
  c.peeked = static_cast<size_t>(n);
  PeekResult r = PeekName(std::string_view(buf, c.peeked));
  if (r.state == PeekState::kNeedMore && (events & (EPOLLRDHUP | EPOLLHUP))) {
    r.state = PeekState::kNoName;  // a FIN: no more bytes will come
  }
  if (r.state == PeekState::kNeedMore) {
    // Wake only when at least one more byte is there (not on the bytes already peeked).
    int lowat = static_cast<int>(c.peeked) + 1;
    setsockopt(c.client, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat));
    return;
  }
  int one = 1;
  setsockopt(c.client, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
  {
    std::lock_guard<std::mutex> lock(mu);
    c.info.name = r.name;
  }
  std::optional<EffectiveRules> rules = hooks.rules_of(c.info.id);
  if (!rules) return Close(c.serial, true);
  const std::string id = c.info.id;
  std::string reason = JudgeName(*rules, r, c.info.dest, c.info.port,
                                 [this, &id](const std::string& name, const IpPrefix& a) {
                                   return hooks.resolved(id, name, a);
                                 });
  if (!reason.empty()) {
    if (r.state != PeekState::kName) spdlog::debug("proxy: sandbox {}: no name: {}", id, r.why);
    return Refuse(c, reason);
  }
  Connect(c);
}

void ConnProxy::Impl::Connect(Conn& c) {
  int fd = socket(c.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    spdlog::warn("proxy: sandbox {}: socket: {}", c.info.id, std::strerror(errno));
    return Close(c.serial, true);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    c.upstream = fd;
    c.state = Conn::State::kConnecting;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  Sockaddr sa = ToSockaddr(c.info.dest, c.info.port);
  c.deadline = Clock::now() + std::chrono::seconds(30);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa.ss), sa.len) != 0 && errno != EINPROGRESS) {
    return Close(c.serial, true);
  }
  Arm(c);
}

void ConnProxy::Impl::Connected(Conn& c) {
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(c.upstream, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == EINPROGRESS || err == EALREADY) return;
  if (err != 0) return Close(c.serial, true);
  // A destination that turned out to be one of the host's own addresses (a local route picks
  // the destination itself as the source): never relay into the host.
  sockaddr_storage ss{};
  socklen_t sl = sizeof(ss);
  if (getsockname(c.upstream, reinterpret_cast<sockaddr*>(&ss), &sl) == 0) {
    auto local = FromSockaddr(ss);
    if (local && local->first == c.info.dest && !opts.loopback_only) return Refuse(c, kReasonHost);
  }
  for (int d = 0; d < 2; ++d) {
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) {
      spdlog::warn("proxy: sandbox {}: pipe2: {}", c.info.id, std::strerror(errno));
      return Close(c.serial, true);
    }
    std::lock_guard<std::mutex> lock(mu);
    c.pipe_r[d] = p[0];
    c.pipe_w[d] = p[1];
    if (opts.pipe_bytes > 0) fcntl(p[1], F_SETPIPE_SZ, static_cast<int>(opts.pipe_bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    c.state = Conn::State::kRelay;
  }
  c.deadline = Clock::now() + opts.idle_timeout;
  Pump(c);
}

// Moves what can move in both directions without blocking, then re-arms epoll for what each
// direction waits for.
void ConnProxy::Impl::Pump(Conn& c) {
  const int src[2] = {c.client, c.upstream};
  const int dst[2] = {c.upstream, c.client};
  bool moved = false;
  for (int d = 0; d < 2; ++d) {
    // Out of the pipe and into it in the same round: the source is read while the destination
    // is still taking the earlier bytes, so neither connection's window waits for the other.
    for (int round = 0; round < kSplicesPerWakeup; ++round) {
      bool progress = false;
      if (c.in_pipe[d] > 0) {
        ssize_t n = splice(c.pipe_r[d], nullptr, dst[d], nullptr, c.in_pipe[d],
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0 && errno != EAGAIN) return Close(c.serial, true);  // EPIPE, ECONNRESET
        if (n > 0) {
          c.in_pipe[d] -= static_cast<size_t>(n);
          c.pipe_full[d] = false;
          progress = moved = true;
        }
      }
      if (!c.eof[d] && !c.pipe_full[d]) {
        ssize_t n = splice(src[d], nullptr, c.pipe_w[d], nullptr, kSpliceChunk,
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0 && errno != EAGAIN) return Close(c.serial, true);
        if (n == 0) {
          c.eof[d] = true;
        } else if (n > 0) {
          c.in_pipe[d] += static_cast<size_t>(n);
          progress = moved = true;
        } else if (c.in_pipe[d] > 0) {
          // EAGAIN with bytes held: the source may be empty or the pipe full; which, splice
          // does not say. Reading waits for the next write out (armed below), which clears it.
          c.pipe_full[d] = true;
        }
      }
      if (!progress) break;
    }
    if (c.eof[d] && c.in_pipe[d] == 0 && !c.shut[d]) {
      shutdown(dst[d], SHUT_WR);  // pass the half-close on
      c.shut[d] = true;
    }
  }
  if (moved) c.deadline = Clock::now() + opts.idle_timeout;
  if (c.shut[0] && c.shut[1]) return Close(c.serial, false);
  Arm(c);
}

// Registers the events each socket waits for now (changed ones only). A socket that waits for
// nothing is taken out of epoll: level-triggered, its HUP or ERR would otherwise wake the loop
// again and again while the other direction drains.
void ConnProxy::Impl::Arm(Conn& c) {
  uint32_t want_client = 0, want_upstream = 0;
  switch (c.state) {
    case Conn::State::kPeek:
      want_client = EPOLLIN | EPOLLRDHUP;
      break;
    case Conn::State::kConnecting:
      want_upstream = EPOLLOUT;  // a client that gives up meanwhile is seen at relay
      break;
    case Conn::State::kRelay:
      // Direction 0 reads the client and writes upstream; direction 1 the reverse.
      if (!c.eof[0] && !c.pipe_full[0]) want_client |= EPOLLIN;
      if (c.in_pipe[0] > 0) want_upstream |= EPOLLOUT;
      if (!c.eof[1] && !c.pipe_full[1]) want_upstream |= EPOLLIN;
      if (c.in_pipe[1] > 0) want_client |= EPOLLOUT;
      break;
  }
  auto set = [this](int fd, uint32_t& now, uint32_t want, uint64_t tag) {
    if (fd < 0 || now == want) return;
    epoll_event ev{want, {.u64 = tag}};
    int op = now == 0 ? EPOLL_CTL_ADD : want == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    if (epoll_ctl(epfd, op, fd, &ev) != 0) {
      spdlog::warn("proxy: epoll_ctl({}, fd {}): {}", op, fd, std::strerror(errno));
    }
    now = want;
  };
  set(c.client, c.ev_client, want_client, c.serial);
  set(c.upstream, c.ev_upstream, want_upstream, c.serial | 1);
}

void ConnProxy::Impl::Sweep() {
  auto now = Clock::now();
  // A sandbox whose rules are gone was deleted: its connections go too (CloseAll, if the
  // delete path calls it, is only sooner).
  std::map<std::string, bool> gone;
  for (const auto& [s, c] : conns) {
    if (!gone.count(c->info.id)) gone[c->info.id] = !hooks.rules_of(c->info.id).has_value();
  }
  std::vector<std::pair<uint64_t, bool>> expired;  // serial, peek timeout
  for (const auto& [s, c] : conns) {
    bool dead = c->cut || gone[c->info.id];
    if (dead || now >= c->deadline) expired.emplace_back(s, c->state == Conn::State::kPeek && !dead);
  }
  for (auto [s, peek] : expired) {
    auto it = conns.find(s);
    if (it == conns.end()) continue;
    if (peek) {
      Refuse(*it->second, kReasonNoName);
    } else {
      Close(s, true);
    }
  }
}

void ConnProxy::Impl::Close(uint64_t serial, bool reset) {
  std::unique_ptr<Conn> c;
  std::lock_guard<std::mutex> lock(mu);
  auto it = conns.find(serial);
  if (it == conns.end()) return;
  c = std::move(it->second);
  conns.erase(it);
  auto ps = per_sandbox.find(c->info.id);
  if (ps != per_sandbox.end() && --ps->second == 0) per_sandbox.erase(ps);
  // Closing a socket removes it from epoll; the fds are closed with mu held so a concurrent
  // CutDisallowed never shuts down a number already reused.
  if (reset) {
    CloseWithReset(c->client);
    CloseWithReset(c->upstream);
  } else {
    close(c->client);
    if (c->upstream >= 0) close(c->upstream);
  }
  for (int d = 0; d < 2; ++d) {
    if (c->pipe_r[d] >= 0) close(c->pipe_r[d]);
    if (c->pipe_w[d] >= 0) close(c->pipe_w[d]);
  }
}

}  // namespace sbx::net
