// Denied egress, as a sandbox's network namespace counts it.
//
// A sandbox of egress profile `none` has `lo` and no route (netns.cc): every attempt to reach
// another address fails in the routing lookup with ENETUNREACH before a packet exists, and the
// kernel counts each one in the namespace's SNMP counters (TCP connect, UDP and ping sends, raw
// sends: `Ip: OutNoRoutes` in /proc/PID/net/snmp, `Ip6OutNoRoutes` in /proc/PID/net/snmp6). The
// sandbox cannot reset them (they belong to the namespace, which the host's user namespace
// owns), so their sum is what it tried and was denied since the namespace was made.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

// `OutNoRoutes` of the `Ip:` header/value line pair of a /proc/net/snmp text.
absl::StatusOr<uint64_t> ParseIpOutNoRoutes(std::string_view snmp);
// `Ip6OutNoRoutes` of a /proc/net/snmp6 text ("name<spaces>value" lines).
absl::StatusOr<uint64_t> ParseIp6OutNoRoutes(std::string_view snmp6);

// The sum of both counters in the network namespace of `pid`. A host without IPv6 has no
// snmp6 file: its part is 0. The caller checks afterwards that `pid` is still its process.
absl::StatusOr<uint64_t> ReadNoRouteCount(pid_t pid, const std::string& proc_root = "/proc");

}  // namespace sbx::runtime::ns
