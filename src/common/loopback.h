// The loopback address at a port, as a sockaddr: what the fake runtime dials for a sandbox's
// port (its loopback is the host's) and what a microVM's guest pump dials for a port stream.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

namespace sbx {

// Fills `out` with 127.0.0.1:port, or [::1]:port; returns its length.
inline socklen_t LoopbackSockaddr(uint16_t port, bool ipv6, sockaddr_storage* out) {
  *out = {};
  if (ipv6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(out);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    a->sin6_addr = in6addr_loopback;
    return sizeof(*a);
  }
  auto* a = reinterpret_cast<sockaddr_in*>(out);
  a->sin_family = AF_INET;
  a->sin_port = htons(port);
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sizeof(*a);
}

}  // namespace sbx
