#include "runtime/ns/port_dial.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::runtime::ns {

absl::StatusOr<UniqueFd> DialLoopback(int ns_source, uint16_t port, bool ipv6) {
  const int family = ipv6 ? AF_INET6 : AF_INET;
  UniqueFd sock;
  if (ns_source < 0) {
    sock.Reset(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) return ErrnoStatus(errno, "dial port: socket(AF_INET)");
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
  int rc;
  if (ipv6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    a.sin6_addr = in6addr_loopback;
    rc = ::connect(sock.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = ::connect(sock.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (rc != 0 && errno != EINPROGRESS) {
    const int err = errno;
    const std::string where = ipv6 ? fmt::format("[::1]:{}", port) : fmt::format("127.0.0.1:{}", port);
    if (err == ECONNREFUSED) {
      return absl::UnavailableError(fmt::format("dial port: connect({}): nothing listening", where));
    }
    return ErrnoStatus(err, fmt::format("dial port: connect({})", where));
  }
  return sock;
}

}  // namespace sbx::runtime::ns
