// Egress rules and profiles: what a sandbox's network may reach.
//
// A rule is a JSON object, the same in the configuration, at create and in the API's answers:
//   {"cidr": "203.0.113.0/24", "ports": "443" | "8000-8100", "protocol": "tcp" | "udp" | "any"}
// `ports` absent: every port; `protocol` absent: "any" (TCP, UDP and everything else; a port
// range with "any" means TCP and UDP). A rule naming a domain ({"domain": "pypi.org"}) is
// refused with an error saying why: domain rules hold only with sbx's own resolver and the
// Host/SNI check on each connection, which come later (issue 16); accepting them now would
// silently allow nothing or, worse, an address that a name once resolved to.
//
// Profiles: `none` (loopback only), `open` (every address minus the always-blocked ranges) and
// named allow-lists of the configuration (allow rules plus an optional deny list). Whatever the
// profile, AlwaysBlocked() ranges, the operator's deny list and the host itself are refused;
// an operator's exempt ranges lift the always-blocked ranges they cover (a lab network), never
// the host's own addresses, other sandboxes or the metadata addresses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "net/ip_prefix.h"

namespace sbx::net {

enum class Protocol { kAny, kTcp, kUdp };

struct EgressRule {
  IpPrefix dest;
  uint16_t port_lo = 0;  // 0 with port_hi 0: every port
  uint16_t port_hi = 0;
  Protocol protocol = Protocol::kAny;

  bool any_port() const { return port_lo == 0 && port_hi == 0; }
  // True when every packet this rule lets through, `wider` lets through too.
  bool WithinRule(const EgressRule& wider) const;
  nlohmann::json ToJson() const;
};

// `field` names the value in errors ("egress.allow[2]", "egress_profiles.lab.allow[0]").
absl::StatusOr<EgressRule> ParseRule(const nlohmann::json& j, std::string_view field);
absl::StatusOr<std::vector<EgressRule>> ParseRules(const nlohmann::json& j, std::string_view field);

struct EgressProfile {
  std::string name;
  std::string description;
  bool networked = false;           // false only for `none`: loopback, no veth at all
  std::vector<EgressRule> allow;    // `open`: 0.0.0.0/0 and ::/0
  std::vector<EgressRule> deny;     // refused before `allow` is looked at
  nlohmann::json ToJson() const;    // {"name","description","rules":[{"action":...}]}
};

// The two built-in profiles.
EgressProfile NoneProfile();
EgressProfile OpenProfile();

// A profile of the configuration: {"description": "...", "allow": [rules], "deny": [rules]}.
// `name` must be 1-63 of [a-z0-9_] and neither `none` nor `open`.
absl::StatusOr<EgressProfile> ParseProfile(std::string_view name, const nlohmann::json& j);

// A per-sandbox `egress` at create: {"allow": [rules]} narrowing `profile`. Each rule must lie
// within one allow rule of the profile (FailedPrecondition-free InvalidArgument naming the
// field otherwise: the request may not widen its profile). `none` cannot be narrowed.
absl::StatusOr<std::vector<EgressRule>> ParseNarrowing(const EgressProfile& profile,
                                                       const nlohmann::json& egress);

// Ranges refused whatever the profile, with the reason a denial is counted under. The
// `metadata` ones cannot be exempted.
struct BlockedRange {
  IpPrefix range;
  std::string reason;  // "private", "loopback", "link_local", "cgnat", "multicast",
                       // "documentation", "reserved", "metadata"
};
const std::vector<BlockedRange>& AlwaysBlocked();

}  // namespace sbx::net
