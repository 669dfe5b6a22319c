#include "runtime/ns/port_dial.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::runtime::ns {

absl::StatusOr<UniqueFd> DialLoopback(int ns_source, uint16_t port, bool ipv6) {
  std::array<uint8_t, 16> loopback{};
  if (ipv6) {
    std::memcpy(loopback.data(), &in6addr_loopback, 16);
  } else {
    const uint32_t lo = htonl(INADDR_LOOPBACK);
    std::memcpy(loopback.data(), &lo, 4);
  }
  return DialAddress(ns_source, ipv6 ? AF_INET6 : AF_INET, loopback.data(), port);
}

absl::StatusOr<UniqueFd> DialAddress(int ns_source, int family, const uint8_t* addr, uint16_t port) {
  UniqueFd sock;
  if (ns_source < 0) {
    sock.Reset(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) return ErrnoStatus(errno, "dial port: socket()");
  } else {
    UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!original) return ErrnoStatus(errno, "dial port: open(/proc/thread-self/ns/net)");
    if (::setns(ns_source, CLONE_NEWNET) != 0) {
      return ErrnoStatus(errno, "dial port: setns(sandbox network namespace)");
    }
    sock.Reset(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    const int err = errno;
    if (::setns(original.get(), CLONE_NEWNET) != 0) {
      // This thread would serve the API from a sandbox's namespace: nothing may continue on it.
      const int back = errno;
      fmt::print(stderr, "sbxd: dial port: setns back to the host network namespace: {}\n",
                 std::strerror(back));
      std::abort();
    }
    if (!sock) return ErrnoStatus(err, "dial port: socket() in the sandbox network namespace");
  }
  const int one = 1;
  // Small requests and WebSocket messages go out at once, as a direct client's would.
  (void)::setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_storage ss{};
  socklen_t len;
  char text[INET6_ADDRSTRLEN] = "?";
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    std::memcpy(&a->sin6_addr, addr, 16);
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    std::memcpy(&a->sin_addr, addr, 4);
    len = sizeof(*a);
  }
  ::inet_ntop(family, addr, text, sizeof(text));
  const std::string where = family == AF_INET6 ? fmt::format("[{}]:{}", text, port) : fmt::format("{}:{}", text, port);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    if (err == ECONNREFUSED) {
      return absl::UnavailableError(fmt::format("dial port: connect({}): nothing listening", where));
    }
    return ErrnoStatus(err, fmt::format("dial port: connect({})", where));
  }
  return sock;
}

}  // namespace sbx::runtime::ns
