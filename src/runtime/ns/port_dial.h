// Port exposure's way into a sandbox (Instance::DialPort): a socket made in the sandbox's network
// namespace keeps that namespace for its whole life, so sbxd can connect to the sandbox's own
// loopback (a server bound to 127.0.0.1 or ::1 only) without a veth, a route or an egress rule.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

// In the network namespace of `ns_source` (a pidfd of a process in it, or an open
// /proc/PID/ns/net; Linux >= 5.8 takes a pidfd), makes a non-blocking TCP socket and starts its
// connect to 127.0.0.1:`port` (or [::1]:`port`), then returns this thread to the namespace it
// was in. Only the calling thread moves, for the span of one socket(2): what it does afterwards
// runs in the host namespace again. ns_source < 0: the current namespace (tests, the fake
// runtime). ECONNREFUSED at once is returned as kUnavailable.
absl::StatusOr<UniqueFd> DialLoopback(int ns_source, uint16_t port, bool ipv6);

// The same for any address: `addr` is 4 (AF_INET) or 16 (AF_INET6) bytes in network order.
// The microvm runtime dials a guest's own address over its tap with it (ns_source < 0).
absl::StatusOr<UniqueFd> DialAddress(int ns_source, int family, const uint8_t* addr, uint16_t port);

}  // namespace sbx::runtime::ns
