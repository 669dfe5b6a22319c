// Network-namespace helpers of the networking root tests (net_egress, net_pool, net_patch):
// each test builds its "host", "internet" and sandbox namespaces from these, never touching the
// host's own network. Header-only: each test binary includes it once.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "net/ip_prefix.h"
#include "net/netlink.h"

namespace sbx::net::nstest {

// An interface address: the host's address with its subnet's length ("198.18.0.1/24").
inline IpPrefix IfAddr(const std::string& text) {
  size_t slash = text.find('/');
  IpPrefix p = *IpPrefix::Parse(text.substr(0, slash));
  if (slash != std::string::npos) p.len = std::stoi(text.substr(slash + 1));
  return p;
}

inline UniqueFd CurrentNetns() {
  return UniqueFd(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
}

// A new namespace with lo up; the calling thread stays where it was.
inline UniqueFd NewNetns() {
  UniqueFd here = CurrentNetns();
  if (::unshare(CLONE_NEWNET) != 0) return {};
  UniqueFd fresh = CurrentNetns();
  {
    auto nl = Netlink::Open();
    if (nl.ok()) {
      auto lo = nl->IfIndex("lo");
      if (lo.ok()) (void)nl->SetUp(*lo);
    }
  }
  if (::setns(here.get(), CLONE_NEWNET) != 0) std::abort();
  return fresh;
}

// Runs `f` with the calling thread in `ns`, then returns.
template <typename F>
auto InNetns(int ns, F f) {
  UniqueFd here = CurrentNetns();
  if (::setns(ns, CLONE_NEWNET) != 0) std::abort();
  auto r = f();
  if (::setns(here.get(), CLONE_NEWNET) != 0) std::abort();
  return r;
}

// An IPv4 or IPv6 socket address.
inline sockaddr_storage Addr(const std::string& ip, int port, socklen_t* len) {
  sockaddr_storage ss{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*v4);
  } else {
    ::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(*v6);
  }
  return ss;
}

// A TCP listener in `ns` on ip:port.
inline UniqueFd Listen(int ns, const std::string& ip, int port) {
  return InNetns(ns, [&] {
    socklen_t len;
    sockaddr_storage a = Addr(ip, port, &len);
    UniqueFd s(::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a.ss_family == AF_INET6) ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(s.get(), 64) != 0) {
      ADD_FAILURE() << "listen " << ip << ":" << port << ": " << strerror(errno);
    }
    return s;
  });
}

// A TCP connection from namespace `ns` (non-blocking), or an empty fd when the handshake does not
// complete within `timeout_ms`: a refused packet is dropped, so a refusal is a timeout. `from`
// binds the source address first (the spoofing case; IP_TRANSPARENT, root here, lets the kernel
// take a source that is not local: sandbox root lacks CAP_NET_ADMIN and CAP_NET_RAW in its
// network namespace, so the rule under test is the second line of defence).
inline UniqueFd Connect(int ns, const std::string& ip, int port, int timeout_ms = 3000,
                        const std::string& from = "") {
  socklen_t len;
  sockaddr_storage a = Addr(ip, port, &len);
  UniqueFd s = InNetns(ns, [&] {
    return UniqueFd(::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  });
  if (!from.empty()) {
    socklen_t blen;
    sockaddr_storage b = Addr(from, 0, &blen);
    int one = 1;
    ::setsockopt(s.get(), SOL_IP, IP_TRANSPARENT, &one, sizeof(one));
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&b), blen) != 0) {
      ADD_FAILURE() << "bind " << from << ": " << strerror(errno);
    }
  }
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
    if (errno != EINPROGRESS) return {};
    pollfd p{.fd = s.get(), .events = POLLOUT};
    if (::poll(&p, 1, timeout_ms) != 1) return {};
    int err = 0;
    socklen_t el = sizeof(err);
    ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) return {};
  }
  return s;
}

// True when a TCP handshake from `ns` to ip:port completes within `timeout_ms` (see Connect).
inline bool TcpReaches(int ns, const std::string& ip, int port, const std::string& from = "",
                       int timeout_ms = 3000) {
  return static_cast<bool>(Connect(ns, ip, port, timeout_ms, from));
}

}  // namespace sbx::net::nstest
