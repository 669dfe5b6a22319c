// Egress rules and profiles: what a sandbox's network may reach.
//
// A rule is a JSON object, the same in the configuration, at create and in the API's answers:
//   {"cidr": "203.0.113.0/24", "ports": "443" | "8000-8100", "protocol": "tcp" | "udp" | "any"}
//   {"domain": "pypi.org" | "*.pythonhosted.org", "ports": "443", "protocol": "tcp"}
// `ports` absent: every port; `protocol` absent: "any" for a CIDR rule (TCP, UDP and everything
// else; a port range with "any" means TCP and UDP), "tcp" for a domain rule.
//
// A domain rule holds only through sbxd's own resolver (it answers the names the rules allow and
// records which addresses each name resolved to for this sandbox) and the Host/SNI check on each
// connection (the name a connection asks for must be allowed AND must have resolved to the
// address it goes to). So a domain rule is TCP only: QUIC and other UDP carry no name sbx can
// read before the first packet leaves. `*.x` matches every name below `x`, never `x` itself
// (an operator writes both when both are meant). Names are kept lowercase, without the root dot.
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
  IpPrefix dest;          // a CIDR rule's range (unused by a domain rule)
  std::string domain;     // a domain rule's pattern: "pypi.org", "*.pythonhosted.org"
  uint16_t port_lo = 0;  // 0 with port_hi 0: every port
  uint16_t port_hi = 0;
  Protocol protocol = Protocol::kAny;

  bool any_port() const { return port_lo == 0 && port_hi == 0; }
  bool is_domain() const { return !domain.empty(); }
  // A domain rule whose pattern matches `name` (lowercase, no root dot); false for a CIDR rule.
  bool MatchesName(std::string_view name) const;
  // MatchesName, and `port` within the rule's ports (port 0: "some port", as a DNS lookup asks).
  bool Matches(std::string_view name, uint16_t port) const;
  // True for a rule of every address (0.0.0.0/0 or ::/0), as `open` has: names are unrestricted.
  bool AllAddresses() const { return !is_domain() && dest.len == 0; }
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

// Whether any rule is a domain rule: such a sandbox's TCP goes through the Host/SNI check, its
// DNS only to sbxd's resolver, its UDP nowhere but there.
bool HasDomainRules(const std::vector<EgressRule>& rules);
// Whether a connection to `name` on `port` is allowed, or with `port` 0 whether sbxd's resolver
// answers `name` at all. A matching deny rule refuses it (a lookup is refused only by a deny rule
// of every port: the name may still be reached on its other ports); then a matching domain allow
// rule, or an allow rule of every address (`open`: every name resolves, addresses decide),
// admits it. A CIDR-only allow-list resolves no name: forwarding arbitrary names upstream would
// be a way out (DNS tunnelling) for a sandbox whose addresses are limited.
bool NameAllowed(const std::vector<EgressRule>& allow, const std::vector<EgressRule>& deny,
                 std::string_view name, uint16_t port);
// A name as sbx keeps it: lowercase, root dot dropped; empty when it is not a valid host name
// (labels of 1-63 of [a-z0-9-_], 253 bytes at most, no IP literal).
std::string NormalizeName(std::string_view name);

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
