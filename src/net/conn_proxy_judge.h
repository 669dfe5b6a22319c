// The decision sbxd's connection proxy (conn_proxy.h) takes on one connection of a sandbox
// with domain rules, as pure functions (unit-tested without sockets or root).
//
// Order, first match wins:
//   1. a CIDR deny rule covering the destination and port: `deny_rule`;
//   2. a CIDR allow rule covering them: allowed without reading a name (the forward chain
//      would have let the packet through had the address not also been resolved for a name);
//   3. no readable name (not TLS with one SNI, not HTTP/1.x with one Host): `no_name`;
//   4. the name not allowed for this port by the sandbox's rules (deny first): `name_not_allowed`;
//   5. the destination is not an address sbxd's resolver answered this sandbox for that name:
//      `name_address_mismatch` (an allowed name sent to another address: a shared CDN front,
//      a forged /etc/hosts entry);
//   otherwise allowed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "net/egress_rules.h"
#include "net/ip_prefix.h"
#include "net/peek.h"
#include "net/sandbox_net.h"

namespace sbx::net {

inline constexpr const char* kReasonNoName = "no_name";
inline constexpr const char* kReasonNameNotAllowed = "name_not_allowed";
inline constexpr const char* kReasonNameAddressMismatch = "name_address_mismatch";

// A CIDR rule (domain rules never) that admits TCP to `dest`:`port`.
bool CidrRuleAdmits(const EgressRule& rule, const IpPrefix& dest, uint16_t port);

enum class CidrVerdict { kNone, kDenied, kAllowed };
// Steps 1-2: what the CIDR rules alone say about TCP to `dest`:`port`.
CidrVerdict JudgeCidr(const EffectiveRules& rules, const IpPrefix& dest, uint16_t port);

// Steps 3-5 for a connection the CIDR rules left undecided. `resolved(name, dest)` asks the
// NameTable. Returns the denial reason, or an empty string when the connection may go on.
std::string JudgeName(const EffectiveRules& rules, const PeekResult& peek, const IpPrefix& dest,
                      uint16_t port,
                      const std::function<bool(const std::string&, const IpPrefix&)>& resolved);

// Whether a connection already relayed may stay under `rules` (a PATCH, step 1, 2 and 4 only:
// what it resolved to does not change with the rules). `name` empty: it passed by a CIDR rule.
bool StillAllowed(const EffectiveRules& rules, const std::string& name, const IpPrefix& dest,
                  uint16_t port);

}  // namespace sbx::net
