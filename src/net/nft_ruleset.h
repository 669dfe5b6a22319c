// The nftables rules of sbx, as text for libnftables (pure functions: unit-tested without root).
//
// One table of sbx's own, `inet sbx`, so nothing of the operator's ruleset is touched:
//   chain forward (hook forward): a packet from a sandbox veth jumps, through the verdict map
//     `from_sandbox` (veth name -> that sandbox's chain), to the chain named after the sandbox
//     id; a packet toward a sandbox veth passes only as part of a connection the sandbox began;
//     anything else from an sbx veth (a leftover) is dropped.
//   chain input (hook input): a sandbox may send the host only IPv6 neighbour discovery and
//     replies; everything else is counted per sandbox (reason `host`) and dropped. This holds
//     the host's own addresses and loopback services (sbxd's API) whatever the profile.
//   chain postrouting (nat): sandbox addresses are masqueraded toward the uplink.
// Per sandbox `ID`: chain ID (the order below is the order of the rules), chain ID_in, and one
// named counter per denial reason, `ID__REASON`, so a denial is counted where it is dropped.
#pragma once

#include <string>
#include <vector>

#include "net/addr_pool.h"
#include "net/egress_rules.h"

namespace sbx::net {

// Reasons a packet is refused, each a counter per sandbox and a label of
// sbx_egress_denied_total. The always-blocked ranges add their own (AlwaysBlocked()).
inline constexpr const char* kReasonSpoofed = "spoofed";        // source not the sandbox's own
inline constexpr const char* kReasonSandbox = "other_sandbox";  // the sandbox address pool
inline constexpr const char* kReasonHost = "host";              // the host itself
inline constexpr const char* kReasonDenyRule = "deny_rule";     // the profile's deny list
inline constexpr const char* kReasonNotAllowed = "not_allowed"; // no allow rule matched
// Every reason, in a fixed order (counters are created and read in it).
const std::vector<std::string>& DenialReasons();

struct NetPolicyConfig {
  IpPrefix pool4, pool6;               // the AddrPool's ranges: other sandboxes
  std::vector<IpPrefix> exempt;        // lift always-blocked ranges (never metadata)
  std::vector<IpPrefix> operator_deny; // refused whatever the profile (reason deny_rule)
  std::string uplink;                  // masquerade toward it; empty: every interface
};

// What a sandbox may reach: its profile's deny list, then its allow rules (the per-sandbox
// narrowing replaces the profile's allow rules: each of its rules lies within them).
struct SandboxPolicy {
  std::vector<EgressRule> deny;
  std::vector<EgressRule> allow;
};

inline constexpr const char* kTable = "sbx";

// Creates the table and its base chains if missing (idempotent) and sets the masquerade rules.
std::string BaseRuleset(const NetPolicyConfig& cfg);
// Adds one sandbox's chains, counters and map elements, in one transaction.
std::string AddSandboxRuleset(const std::string& id, const std::string& veth,
                              const SandboxAddrs& addrs, const NetPolicyConfig& cfg,
                              const SandboxPolicy& policy);
// Removes them; `veth` empty: the map elements are already gone.
std::string DeleteSandboxRuleset(const std::string& id, const std::string& veth);

// Sandbox ids are the only names put in rules: the generator refuses anything else (an id
// with a quote would break out of the ruleset text).
bool IsSafeName(const std::string& s);

}  // namespace sbx::net
