#include "net/dns_server.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "net/denial_log.h"
#include "net/name_table.h"
#include "net/nft.h"
#include "net/sandbox_net.h"

namespace sbx::net {
namespace {

using Clock = std::chrono::steady_clock;

// Who a reply goes to.
struct Sender {
  bool tcp = false;
  uint64_t conn = 0;  // TCP: the connection
  int fd = -1;        // UDP: the socket the query came in on
  sockaddr_storage peer{};
  socklen_t peer_len = 0;
  int ifindex = 0;
  sockaddr_storage local{};  // UDP: where the query was sent (the reply's source)
  std::string id, veth;
};

struct Pending {
  dns::Query q;
  Sender to;
  size_t upstream = 0;
  Clock::time_point deadline;
};

// A query retried over TCP because the upstream's UDP answer was truncated (TC): a large
// answer (many addresses) would otherwise reach the sandbox incomplete or empty.
struct UpstreamTcp {
  Pending p;
  uint16_t uid = 0;
  UniqueFd fd;
  std::string out;  // the length-prefixed query, what is left of it to send
  std::string in;
  bool connected = false;
};

struct Conn {
  UniqueFd fd;
  std::string in, out;
  Clock::time_point idle_deadline;
  bool waiting = false;  // a query of it is upstream: the next waits (one at a time)
  std::string id, veth;
  sockaddr_storage peer{};
  socklen_t peer_len = 0;
};

IpPrefix PrefixOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&ss);
    return IpPrefix::Host(AF_INET, reinterpret_cast<const uint8_t*>(&s4->sin_addr));
  }
  const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&ss);
  return IpPrefix::Host(AF_INET6, reinterpret_cast<const uint8_t*>(&s6->sin6_addr));
}

uint16_t PortOf(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
}

socklen_t SockaddrOf(const IpPrefix& a, uint16_t port, sockaddr_storage* ss) {
  std::memset(ss, 0, sizeof(*ss));
  if (a.is_v4()) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    std::memcpy(&s4->sin_addr, a.addr.data(), 4);
    return sizeof(sockaddr_in);
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(port);
  std::memcpy(&s6->sin6_addr, a.addr.data(), 16);
  return sizeof(sockaddr_in6);
}

bool SameAddress(const IpPrefix& a, const IpPrefix& b) {
  return a.family == b.family && std::memcmp(a.addr.data(), b.addr.data(), a.bytes()) == 0;
}

absl::StatusOr<UniqueFd> Listen(int family, int type, uint16_t port) {
  const char* what = type == SOCK_STREAM ? "tcp" : "udp";
  UniqueFd fd(::socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, fmt::format("dns: socket({})", what));
  int one = 1;
  if (family == AF_INET6) {
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (type == SOCK_DGRAM) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
  } else if (type == SOCK_DGRAM) {
    ::setsockopt(fd.get(), IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
  }
  if (type == SOCK_STREAM) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage ss{};
  IpPrefix any;
  any.family = family;
  any.len = any.bits();
  const socklen_t len = SockaddrOf(any, port, &ss);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return ErrnoStatus(errno, fmt::format("dns: bind({} {} port {}) (egress.dns_port)", what,
                                          family == AF_INET ? "0.0.0.0" : "[::]", port));
  }
  if (type == SOCK_STREAM && ::listen(fd.get(), 64) != 0) {
    return ErrnoStatus(errno, fmt::format("dns: listen(tcp port {})", port));
  }
  return fd;
}

}  // namespace

struct DnsServer::Impl {
  NetworkHost* host = nullptr;
  DnsServerOptions opts;
  std::unique_ptr<Nft> nft;
  UniqueFd udp4, udp6, tcp4, tcp6, up4, up6, wake;
  std::atomic<bool> stop{false};
  std::map<uint16_t, Pending> pending;
  std::map<uint64_t, Conn> conns;
  std::map<uint64_t, UpstreamTcp> up_tcp;
  uint64_t next_conn = 1;
  size_t next_upstream = 0;
  std::mt19937 rng{std::random_device{}()};
  std::string buf = std::string(65536, '\0');

  void Loop();
  void OnUdp(int fd);
  void OnAccept(int fd);
  void OnConn(uint64_t id, short revents);
  void OnUpstream(int fd);
  void RetryOverTcp(Pending p, uint16_t uid);
  void OnUpstreamTcp(uint64_t id, short revents);
  void Expire();
  void HandleQuery(const Sender& s, std::string_view wire);
  void Answer(Pending& p, const dns::Response& r);
  void Send(const Sender& s, const std::string& msg);
  void Flush(Conn& c);
  void Drain(uint64_t cid);
  void CloseConn(uint64_t id) { conns.erase(id); }
  size_t Limit(const Sender& s, const dns::Query& q) const { return s.tcp ? 65535 : q.udp_size; }
  std::optional<std::string> VethOfLocal(const IpPrefix& local);
};

absl::StatusOr<std::unique_ptr<DnsServer>> DnsServer::Start(NetworkHost* host,
                                                            DnsServerOptions opts) {
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->opts = std::move(opts);
  SBX_ASSIGN_OR_RETURN(impl->nft, Nft::Open());
  const uint16_t port = impl->opts.port;
  SBX_ASSIGN_OR_RETURN(impl->udp4, Listen(AF_INET, SOCK_DGRAM, port));
  SBX_ASSIGN_OR_RETURN(impl->udp6, Listen(AF_INET6, SOCK_DGRAM, port));
  SBX_ASSIGN_OR_RETURN(impl->tcp4, Listen(AF_INET, SOCK_STREAM, port));
  SBX_ASSIGN_OR_RETURN(impl->tcp6, Listen(AF_INET6, SOCK_STREAM, port));
  impl->up4.Reset(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  impl->up6.Reset(::socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!impl->up4 || !impl->up6) return ErrnoStatus(errno, "dns: socket(udp upstream)");
  impl->wake.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->wake) return ErrnoStatus(errno, "dns: eventfd");
  std::unique_ptr<DnsServer> server(new DnsServer(std::move(impl)));
  Impl* raw = server->impl_.get();
  server->thread_ = std::thread([raw] { raw->Loop(); });
  return server;
}

DnsServer::DnsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DnsServer::~DnsServer() {
  impl_->stop = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->wake.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void DnsServer::Impl::Loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> conn_ids;
  while (!stop) {
    fds.clear();
    conn_ids.clear();
    for (int fd : {wake.get(), udp4.get(), udp6.get(), tcp4.get(), tcp6.get(), up4.get(), up6.get()}) {
      fds.push_back({fd, POLLIN, 0});
    }
    for (auto& [id, c] : conns) {
      fds.push_back({c.fd.get(), static_cast<short>((c.waiting ? 0 : POLLIN) | (c.out.empty() ? 0 : POLLOUT)), 0});
      conn_ids.push_back(id);
    }
    const size_t up_first = fds.size();
    std::vector<uint64_t> up_ids;
    for (auto& [id, u] : up_tcp) {
      fds.push_back({u.fd.get(), static_cast<short>(!u.connected || !u.out.empty() ? POLLOUT : POLLIN), 0});
      up_ids.push_back(id);
    }
    int timeout = 1000;
    const auto now = Clock::now();
    auto sooner = [&](Clock::time_point deadline) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
      timeout = static_cast<int>(std::clamp<int64_t>(ms + 1, 0, timeout));
    };
    for (const auto& [id, p] : pending) sooner(p.deadline);
    for (const auto& [id, u] : up_tcp) sooner(u.p.deadline);
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
      spdlog::error("dns: poll: {}", ErrnoMessage(errno));
      return;
    }
    if (stop) return;
    if (fds[1].revents) OnUdp(udp4.get());
    if (fds[2].revents) OnUdp(udp6.get());
    if (fds[3].revents) OnAccept(tcp4.get());
    if (fds[4].revents) OnAccept(tcp6.get());
    if (fds[5].revents) OnUpstream(up4.get());
    if (fds[6].revents) OnUpstream(up6.get());
    for (size_t i = 0; i < conn_ids.size(); ++i) {
      if (fds[7 + i].revents) OnConn(conn_ids[i], fds[7 + i].revents);
    }
    for (size_t i = 0; i < up_ids.size(); ++i) {
      if (fds[up_first + i].revents) OnUpstreamTcp(up_ids[i], fds[up_first + i].revents);
    }
    Expire();
  }
}

void DnsServer::Impl::OnUdp(int fd) {
  for (int round = 0; round < 64; ++round) {
    Sender s;
    s.fd = fd;
    iovec iov{buf.data(), dns::kMaxQueryBytes + 1};
    alignas(cmsghdr) char control[256];
    msghdr m{};
    m.msg_name = &s.peer;
    m.msg_namelen = sizeof(s.peer);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &m, MSG_DONTWAIT);
    if (n < 0) return;
    s.peer_len = m.msg_namelen;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
        in_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        s.ifindex = pi.ipi_ifindex;
        auto* l = reinterpret_cast<sockaddr_in*>(&s.local);
        l->sin_family = AF_INET;
        l->sin_addr = pi.ipi_addr;
      } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
        in6_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        s.ifindex = static_cast<int>(pi.ipi6_ifindex);
        auto* l = reinterpret_cast<sockaddr_in6*>(&s.local);
        l->sin6_family = AF_INET6;
        l->sin6_addr = pi.ipi6_addr;
      }
    }
    // Only what came in on an sbx veth: the sandbox is the veth's, whatever the source says.
    std::optional<std::string> id = s.ifindex > 0 ? host->IdOfIfindex(s.ifindex) : std::nullopt;
    char name[IF_NAMESIZE] = {};
    if (!id.has_value() || ::if_indextoname(static_cast<unsigned>(s.ifindex), name) == nullptr ||
        !SlotOfVethName(name).has_value()) {
      continue;
    }
    s.id = *id;
    s.veth = name;
    HandleQuery(s, std::string_view(buf.data(), static_cast<size_t>(n)));
  }
}

// The veth whose host end is `local`: a TCP connection's local address after the redirect,
// which the kernel sets to the incoming interface's own address (the sandbox cannot pick it;
// a connection made straight to egress.dns_port, not redirected, is dropped by nft `input`).
std::optional<std::string> DnsServer::Impl::VethOfLocal(const IpPrefix& local) {
  AddrPool& pool = host->pool();
  const IpPrefix& range = local.is_v4() ? pool.v4() : pool.v6();
  if (range.family != local.family || !range.Contains(local)) return std::nullopt;
  uint64_t offset = 0;
  for (int i = local.bytes() - 8 < 0 ? 0 : local.bytes() - 8; i < local.bytes(); ++i) {
    offset = (offset << 8) | static_cast<uint64_t>(local.addr[i] ^ range.addr[i]);
  }
  const uint64_t slot = offset / 4;
  if (slot >= pool.capacity()) return std::nullopt;
  const SandboxAddrs addrs = pool.AddrsOf(static_cast<uint32_t>(slot));
  if (!SameAddress(local.is_v4() ? addrs.host4 : addrs.host6, local)) return std::nullopt;
  return VethName(static_cast<uint32_t>(slot));
}

void DnsServer::Impl::OnAccept(int fd) {
  for (int round = 0; round < 16; ++round) {
    Conn c;
    c.peer_len = sizeof(c.peer);
    c.fd.Reset(::accept4(fd, reinterpret_cast<sockaddr*>(&c.peer), &c.peer_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c.fd) return;
    if (conns.size() >= kMaxTcp) continue;  // closed: the client retries or gives up
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    if (::getsockname(c.fd.get(), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    auto veth = VethOfLocal(PrefixOf(local));
    if (!veth.has_value()) continue;
    const unsigned ifindex = ::if_nametoindex(veth->c_str());
    auto id = ifindex > 0 ? host->IdOfIfindex(static_cast<int>(ifindex)) : std::nullopt;
    if (!id.has_value()) continue;
    c.id = *id;
    c.veth = *veth;
    c.idle_deadline = Clock::now() + std::chrono::milliseconds(kTcpIdleMs);
    conns.emplace(next_conn++, std::move(c));
  }
}

void DnsServer::Impl::OnConn(uint64_t cid, short revents) {
  auto it = conns.find(cid);
  if (it == conns.end()) return;
  Conn& c = it->second;
  if (revents & POLLOUT) Flush(c);
  if (!(revents & (POLLIN | POLLHUP | POLLERR)) || c.waiting) return;
  char chunk[1024];
  const ssize_t n = ::recv(c.fd.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return CloseConn(cid);
  if (n < 0) return;
  c.in.append(chunk, static_cast<size_t>(n));
  c.idle_deadline = Clock::now() + std::chrono::milliseconds(kTcpIdleMs);
  Drain(cid);
}

// The next whole query of a connection, unless one of it is still upstream (glibc sends the A
// and AAAA queries back to back on one connection).
void DnsServer::Impl::Drain(uint64_t cid) {
  auto it = conns.find(cid);
  if (it == conns.end()) return;
  Conn& c = it->second;
  if (c.waiting || c.in.size() < 2) return;
  const size_t len = (static_cast<uint8_t>(c.in[0]) << 8) | static_cast<uint8_t>(c.in[1]);
  if (len > dns::kMaxQueryBytes) return CloseConn(cid);
  if (c.in.size() < 2 + len) return;
  const std::string msg = c.in.substr(2, len);
  c.in.erase(0, 2 + len);
  Sender s;
  s.tcp = true;
  s.conn = cid;
  s.id = c.id;
  s.veth = c.veth;
  s.peer = c.peer;
  s.peer_len = c.peer_len;
  c.waiting = true;
  HandleQuery(s, msg);  // may close the connection: `c` is not used past here
}

void DnsServer::Impl::Flush(Conn& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) return;
    c.out.erase(0, static_cast<size_t>(n));
  }
}

void DnsServer::Impl::Send(const Sender& s, const std::string& msg) {
  if (s.tcp) {
    auto it = conns.find(s.conn);
    if (it == conns.end()) return;
    Conn& c = it->second;
    c.waiting = false;
    if (c.out.size() > 65536) return CloseConn(s.conn);  // a client that does not read
    c.out.push_back(static_cast<char>(msg.size() >> 8));
    c.out.push_back(static_cast<char>(msg.size() & 0xff));
    c.out += msg;
    Flush(c);
    Drain(s.conn);
    return;
  }
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(in6_pktinfo))] = {};
  msghdr m{};
  m.msg_name = const_cast<sockaddr_storage*>(&s.peer);
  m.msg_namelen = s.peer_len;
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  // From the address the query went to, out of the veth it came in on.
  cmsghdr* c = reinterpret_cast<cmsghdr*>(control);
  if (s.local.ss_family == AF_INET) {
    in_pktinfo pi{};
    pi.ipi_ifindex = s.ifindex;
    pi.ipi_spec_dst = reinterpret_cast<const sockaddr_in*>(&s.local)->sin_addr;
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(pi));
    std::memcpy(CMSG_DATA(c), &pi, sizeof(pi));
    m.msg_controllen = CMSG_SPACE(sizeof(pi));
  } else {
    in6_pktinfo pi{};
    pi.ipi6_ifindex = static_cast<unsigned>(s.ifindex);
    pi.ipi6_addr = reinterpret_cast<const sockaddr_in6*>(&s.local)->sin6_addr;
    c->cmsg_level = IPPROTO_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(pi));
    std::memcpy(CMSG_DATA(c), &pi, sizeof(pi));
    m.msg_controllen = CMSG_SPACE(sizeof(pi));
  }
  if (::sendmsg(s.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    spdlog::debug("dns: sendmsg to sandbox {}: {}", s.id, ErrnoMessage(errno));
  }
}

void DnsServer::Impl::HandleQuery(const Sender& s, std::string_view wire) {
  auto q = dns::ParseQuery(wire);
  if (!q.ok()) {
    if (auto reply = dns::ErrorReplyToBytes(wire)) {
      Send(s, *reply);
    } else if (s.tcp) {
      CloseConn(s.conn);
    }
    return;
  }
  auto rules = host->RulesOf(s.id);
  if (!rules.has_value()) return Send(s, dns::BuildReply(*q, dns::kRefused, {}, Limit(s, *q)));
  if (q->qclass != dns::kClassIn) return Send(s, dns::BuildReply(*q, dns::kNotImp, {}, Limit(s, *q)));
  if (!MayResolve(rules->allow, rules->deny, q->name)) {
    Denial d;
    d.time = absl::Now();
    d.reason = kReasonDnsName;
    d.name = q->name;
    d.protocol = s.tcp ? "tcp" : "udp";
    d.port = 53;
    host->denials_log().Record(s.id, d);
    return Send(s, dns::BuildReply(*q, dns::kRefused, {}, Limit(s, *q)));
  }
  if (q->qtype != dns::kTypeA && q->qtype != dns::kTypeAaaa && q->qtype != dns::kTypeCname) {
    return Send(s, dns::BuildReply(*q, dns::kNoError, {}, Limit(s, *q)));
  }
  if (opts.upstreams.empty() || pending.size() + up_tcp.size() >= kMaxInflight) {
    return Send(s, dns::BuildReply(*q, dns::kServFail, {}, Limit(s, *q)));
  }
  uint16_t uid = 0;
  do {
    uid = static_cast<uint16_t>(rng());
  } while (pending.count(uid) != 0);
  const size_t ui = next_upstream++ % opts.upstreams.size();
  const DnsUpstream& u = opts.upstreams[ui];
  const std::string out = dns::BuildUpstreamQuery(*q, uid);
  sockaddr_storage to{};
  const socklen_t to_len = SockaddrOf(u.addr, u.port, &to);
  const int fd = u.addr.is_v4() ? up4.get() : up6.get();
  if (::sendto(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
               reinterpret_cast<sockaddr*>(&to), to_len) < 0) {
    spdlog::warn("dns: sendto({}): {}", u.ToString(), ErrnoMessage(errno));
    return Send(s, dns::BuildReply(*q, dns::kServFail, {}, Limit(s, *q)));
  }
  pending[uid] = Pending{*q, s, ui, Clock::now() + std::chrono::milliseconds(opts.timeout_ms)};
}

void DnsServer::Impl::OnUpstream(int fd) {
  for (int round = 0; round < 64; ++round) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    const ssize_t n = ::recvfrom(fd, buf.data(), buf.size(), MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return;
    if (n < 2) continue;
    const uint16_t uid = static_cast<uint16_t>((static_cast<uint8_t>(buf[0]) << 8) | static_cast<uint8_t>(buf[1]));
    auto it = pending.find(uid);
    if (it == pending.end()) continue;
    const DnsUpstream& u = opts.upstreams[it->second.upstream];
    if (!SameAddress(PrefixOf(from), u.addr) || PortOf(from) != u.port) continue;
    auto r = dns::ParseResponse(std::string_view(buf.data(), static_cast<size_t>(n)), it->second.q, uid);
    if (!r.ok()) {
      // Not taken: a forger's bytes must not end the wait for the real answer.
      spdlog::debug("dns: answer from {}: {}", u.ToString(), std::string(r.status().message()));
      continue;
    }
    Pending p = std::move(it->second);
    pending.erase(it);
    if (r->tc) {
      RetryOverTcp(std::move(p), uid);
      continue;
    }
    Answer(p, *r);
  }
}

// The same question to the same upstream over TCP, within what is left of the query's time
// (RFC 7766: a truncated UDP answer is retried over TCP). SERVFAIL when it cannot be sent.
void DnsServer::Impl::RetryOverTcp(Pending p, uint16_t uid) {
  const DnsUpstream& u = opts.upstreams[p.upstream];
  UpstreamTcp t;
  t.fd.Reset(::socket(u.addr.is_v4() ? AF_INET : AF_INET6,
                      SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_storage to{};
  const socklen_t to_len = SockaddrOf(u.addr, u.port, &to);
  if (!t.fd || (::connect(t.fd.get(), reinterpret_cast<sockaddr*>(&to), to_len) != 0 &&
                errno != EINPROGRESS)) {
    spdlog::warn("dns: {} over tcp to {}: {}", p.q.name, u.ToString(), ErrnoMessage(errno));
    return Send(p.to, dns::BuildReply(p.q, dns::kServFail, {}, Limit(p.to, p.q)));
  }
  const std::string q = dns::BuildUpstreamQuery(p.q, uid);
  t.out.push_back(static_cast<char>(q.size() >> 8));
  t.out.push_back(static_cast<char>(q.size() & 0xff));
  t.out += q;
  t.p = std::move(p);
  t.uid = uid;
  up_tcp.emplace(next_conn++, std::move(t));
}

void DnsServer::Impl::OnUpstreamTcp(uint64_t id, short revents) {
  auto it = up_tcp.find(id);
  if (it == up_tcp.end()) return;
  UpstreamTcp& t = it->second;
  auto fail = [&](std::string_view why) {
    spdlog::warn("dns: {} over tcp to {}: {}", t.p.q.name,
                 opts.upstreams[t.p.upstream].ToString(), why);
    Pending p = std::move(t.p);
    up_tcp.erase(it);
    Send(p.to, dns::BuildReply(p.q, dns::kServFail, {}, Limit(p.to, p.q)));
  };
  if (!t.connected) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(t.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == EINPROGRESS || (err == 0 && !(revents & (POLLOUT | POLLERR | POLLHUP)))) return;
    if (err != 0) return fail(fmt::format("connect: {}", ErrnoMessage(err)));
    t.connected = true;
  }
  while (!t.out.empty()) {
    const ssize_t n = ::send(t.fd.get(), t.out.data(), t.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return fail(fmt::format("send: {}", ErrnoMessage(errno)));
    t.out.erase(0, static_cast<size_t>(n));
  }
  if (!(revents & (POLLIN | POLLHUP | POLLERR))) return;
  for (;;) {
    const ssize_t n = ::recv(t.fd.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) return fail(fmt::format("recv: {}", ErrnoMessage(errno)));
    if (n == 0) return fail("closed before a whole answer");
    t.in.append(buf.data(), static_cast<size_t>(n));
    if (t.in.size() < 2) continue;
    const size_t want = (static_cast<uint8_t>(t.in[0]) << 8) | static_cast<uint8_t>(t.in[1]);
    if (t.in.size() < 2 + want) continue;
    auto r = dns::ParseResponse(std::string_view(t.in).substr(2, want), t.p.q, t.uid);
    if (!r.ok()) return fail(std::string(r.status().message()));
    Pending p = std::move(t.p);
    up_tcp.erase(it);
    return Answer(p, *r);
  }
}

void DnsServer::Impl::Answer(Pending& p, const dns::Response& r) {
  const dns::Query& q = p.q;
  // The rules may have changed while the query was upstream (PATCH, the sandbox gone).
  auto rules = host->RulesOf(p.to.id);
  if (!rules.has_value() || !MayResolve(rules->allow, rules->deny, q.name)) {
    return Send(p.to, dns::BuildReply(q, dns::kRefused, {}, Limit(p.to, q)));
  }
  CheckedAnswer checked = CheckAnswer(host->config(), dns::Chain(r.answers, q.name, q.qtype));
  for (const auto& [addr, reason] : checked.stripped) {
    Denial d;
    d.time = absl::Now();
    d.reason = reason;
    d.dest = addr.AddressString();
    d.name = q.name;
    d.protocol = "dns";
    host->denials_log().Record(p.to.id, d);
    spdlog::warn("dns: sandbox {}: the answer for {} named {} ({}): removed", p.to.id, q.name,
                 addr.AddressString(), reason);
  }
  if (!checked.addrs.empty()) {
    host->names().Record(p.to.id, q.name, checked.addrs, std::chrono::seconds(checked.ttl));
    if (HasDomainRules(rules->allow)) {
      // Before the reply: the connection that follows it must find the elements.
      if (auto st = nft->Run(AddResolvedCommands(p.to.veth, checked.addrs, checked.ttl),
                             fmt::format("dns: sandbox {}: record {}", p.to.id, q.name));
          !st.ok()) {
        spdlog::error("{}", std::string(st.message()));
        return Send(p.to, dns::BuildReply(q, dns::kServFail, {}, Limit(p.to, q)));
      }
    }
  }
  Send(p.to, dns::BuildReply(q, r.rcode, checked.records, Limit(p.to, q)));
}

void DnsServer::Impl::Expire() {
  const auto now = Clock::now();
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    Pending p = std::move(it->second);
    it = pending.erase(it);
    Send(p.to, dns::BuildReply(p.q, dns::kServFail, {}, Limit(p.to, p.q)));
  }
  for (auto it = up_tcp.begin(); it != up_tcp.end();) {
    if (it->second.p.deadline > now) {
      ++it;
      continue;
    }
    Pending p = std::move(it->second.p);
    it = up_tcp.erase(it);
    Send(p.to, dns::BuildReply(p.q, dns::kServFail, {}, Limit(p.to, p.q)));
  }
  for (auto it = conns.begin(); it != conns.end();) {
    if (!it->second.waiting && it->second.idle_deadline < now) {
      it = conns.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace sbx::net
