// IpPrefix: an IPv4 or IPv6 address with a prefix length ("203.0.113.0/24", "2001:db8::/32", a
// bare address is a /32 or /128). Egress rules, the always-blocked ranges and the address pool
// are all made of these.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx::net {

struct IpPrefix {
  int family = 0;                   // AF_INET or AF_INET6
  std::array<uint8_t, 16> addr{};   // network byte order; IPv4 uses the first 4 bytes
  int len = 0;                      // prefix length: 0..32 or 0..128

  // Rejects host bits set below the prefix ("10.0.0.1/8"): a rule that reads as one host but
  // means a whole network is a mistake an operator should see, not have silently widened.
  static absl::StatusOr<IpPrefix> Parse(std::string_view text);
  // A single address (a /32 or /128) from its bytes.
  static IpPrefix Host(int family, const uint8_t* bytes);

  int bits() const { return family == 2 ? 32 : 128; }  // AF_INET is 2 on Linux
  int bytes() const { return bits() / 8; }
  bool is_v4() const { return family == 2; }
  // True when every address of `other` is in this prefix (same family).
  bool Contains(const IpPrefix& other) const;
  bool Overlaps(const IpPrefix& other) const { return Contains(other) || other.Contains(*this); }
  // "203.0.113.0/24"; a host prefix keeps its "/32".
  std::string ToString() const;
  // The address alone, without the length.
  std::string AddressString() const;
  // The address `offset` past this prefix's network address (no overflow check beyond 64 bits:
  // the pool never offsets more than that).
  IpPrefix Offset(uint64_t offset, int new_len) const;

  bool operator==(const IpPrefix& o) const {
    return family == o.family && len == o.len && addr == o.addr;
  }
};

}  // namespace sbx::net
