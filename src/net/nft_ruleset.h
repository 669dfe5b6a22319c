// The nftables rules of sbx, as text for libnftables (pure functions: unit-tested without root).
//
// One table of sbx's own, `inet sbx`, so nothing of the operator's ruleset is touched. Every
// rule is shared by all sandboxes; a sandbox adds only set and map elements keyed by its veth
// name. That keeps a create O(1): libnftables reads the table's chains and objects back before
// each transaction, so per-sandbox chains or named counters made every create slower as
// sandboxes accumulated (10.6 ms of CPU per create at 400 sandboxes with named counters,
// 0.16 ms at 1,000 with elements only; the experiment is in docs/isolation.md).
//   chain forward (hook forward): a packet from an sbx veth goes to chain `egress`; a packet
//     toward one passes only as part of a connection the sandbox began.
//   chain egress, in order: source-address validation (set own4/own6: veth . address),
//     other sandboxes (the pool ranges), metadata (never exempt), the always-blocked ranges
//     minus the operator's exempt list, the operator's deny list, then through the verdict map
//     `profile_of` (veth -> profile chain, or the sandbox's own chain when its create narrowed
//     the profile) the profile's deny and allow rules; what no allow rule accepts is dropped.
//   chain input (hook input): a sandbox may send the host only IPv6 neighbour discovery and
//     replies; everything else is dropped (reason `host`): the host's own addresses and
//     loopback services, sbxd's API above all, whatever the profile.
//   chain postrouting (nat): sandbox addresses are masqueraded toward the uplink.
// Denials are counted per sandbox and reason by per-element counters of the sets
// `deny_REASON` (type ifname). Each refusal is a rule pair: the first counts (a lookup in the
// set), the second drops unconditionally, so a missing element can lose a count, never let a
// packet through.
#pragma once

#include <optional>
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
inline constexpr const char* kReasonUdpDomain = "udp_domain";   // UDP under domain rules
inline constexpr const char* kReasonConnLimit = "conn_limit";   // egress.max_connections reached
// Every reason, in a fixed order (counters are created and read in it).
const std::vector<std::string>& DenialReasons();
// A `none` sandbox's refusals: it has no route, so the kernel refuses every send with
// ENETUNREACH in the sandbox's own namespace (Ip: OutNoRoutes). Not an nftables counter.
inline constexpr const char* kReasonNoRoute = "no_route";

struct NetPolicyConfig {
  IpPrefix pool4, pool6;               // the AddrPool's ranges: other sandboxes
  std::vector<IpPrefix> exempt;        // lift always-blocked ranges (never metadata)
  std::vector<IpPrefix> operator_deny; // refused whatever the profile (reason deny_rule)
  std::string uplink;                  // masquerade toward it; empty: every interface
  // The named allow-lists of the configuration; `open` is always there, `none` never is (it
  // has no veth).
  std::vector<EgressProfile> profiles;
  // sbxd's resolver (egress.dns_port, DNS section below); 0: none, DNS to the host is dropped
  // like any other packet to it.
  uint16_t dns_port = 0;
  // sbxd's Host/SNI proxy (conn_proxy.h) listens here; 0: no proxy rules (and domain-ruled
  // sandboxes reach nothing by name).
  uint16_t proxy_port = 0;
  // Connections (conntrack entries: TCP, UDP and ICMP flows) a sandbox may have open at once,
  // 0 for no limit (egress.max_connections): the next one is refused, reason conn_limit.
  uint32_t max_connections = 0;
  // Bandwidth per sandbox each way in Mbit/s, 0 for none (egress.rate_mbit; limits.h).
  uint32_t rate_mbit = 0;
};

// What a sandbox may reach: a networked profile, optionally narrowed at create (the narrowing
// replaces the profile's allow rules; each of its rules lies within them, ParseNarrowing).
// A narrowed sandbox has a chain of its own, named after its id.
struct SandboxPolicy {
  std::string profile = "open";
  std::optional<std::vector<EgressRule>> narrowed;
};

inline constexpr const char* kTable = "sbx";

// Creates the table, its sets and chains if missing and (re)writes the shared rules: run at
// start (and on a configuration reload), it keeps the sandboxes' elements.
std::string BaseRuleset(const NetPolicyConfig& cfg);
// A sandbox's elements (and its chain when narrowed), in one transaction.
// NotFound-free by construction: `policy.profile` must be `open` or one of cfg.profiles
// (the caller checks; the transaction fails otherwise).
// `tap`: the link is a microVM's tap (net/tap.h), whose guest sends through its VMM, outside
// any qdisc: it joins the `taps` set, where the base ruleset polices what it sends at
// cfg.rate_mbit (the ns runtime shapes its veth's sandbox end instead, limits.h).
std::string AddSandboxRuleset(const std::string& id, const std::string& veth,
                              const SandboxAddrs& addrs, const NetPolicyConfig& cfg,
                              const SandboxPolicy& policy, bool tap = false);
// The element that puts a tap in the `taps` set (AddSandboxRuleset with tap, and an adopted
// tap made before the set existed); "add" keeps one that is there.
std::string AddTapElement(const std::string& veth);
// Removes them. Each line is a command of its own: a caller whose transaction failed because
// one element was already gone runs them one by one.
std::vector<std::string> DeleteSandboxCommands(const std::string& id, const std::string& veth,
                                               const SandboxAddrs& addrs, bool narrowed, bool tap = false);
// A PATCH of a running sandbox's allow rules (each within its profile's: the caller checks),
// one transaction: the sandbox's own chain (made now when its create did not narrow) is
// refilled with the profile's deny rules and `allow`, and its map element points at it.
// Flows already open are the caller's (conntrack.h): their next packet from the sandbox is
// judged by the new chain, since the forward chain sends every packet from a veth through it.
std::string PatchSandboxRuleset(const std::string& id, const std::string& veth,
                                const NetPolicyConfig& cfg, const std::string& profile,
                                const std::vector<EgressRule>& allow, bool has_own_chain);
// The shared rules that bound each sandbox's connections (cfg.max_connections): a dynamic set
// keyed by veth whose elements count the sandbox's conntrack entries (`ct count`). Part of
// BaseRuleset, in the egress chain just before the profile's verdict, so refused packets never
// take a place.
std::string ConnLimitRules(const NetPolicyConfig& cfg);

// The chain of profile `name`.
std::string ProfileChain(const std::string& name);

// ---- DNS: sbxd's resolver (dns_server.h) ------------------------------------------------------
// Reasons of the resolver's packet-level refusals (in DenialReasons()):
inline constexpr const char* kReasonDnsOther = "dns_other";  // DNS to another resolver
inline constexpr const char* kReasonUnresolved = "unresolved_address";  // see below
//
// With cfg.dns_port set, BaseRuleset adds:
//   chain prerouting (nat, hook prerouting): UDP and TCP port 53 from an sbx veth to any of the
//     host's own addresses (a sandbox's resolv.conf names its veth's host end) is redirected to
//     dns_port, which rewrites the destination to the incoming veth's own address;
//   chain input: exactly those redirected packets (ct status dnat, dport dns_port, source one
//     of the veth's own addresses: own4/own6) are accepted,
//     before the drop of everything else a sandbox sends the host; a packet sent straight to
//     dns_port is not redirected and is dropped (reason `host`).
// A chain whose allow rules hold a domain rule (DomainRuled) refuses DNS (UDP/TCP port 53) to
// every other resolver first (reason dns_other), whatever its CIDR rules allow: an answer the
// resolver did not give would be an address no name check saw; and counts what no allow rule
// accepts as `unresolved_address` rather than `not_allowed`.
//
// Sets resolved4 / resolved6 (type ifname . ipv4_addr / ipv6_addr, flags timeout): veth .
// address for each address sbxd's resolver answered a domain-ruled sandbox, each element
// living the answer's TTL clamped to [30 s, 1 h] (NameTable's clamp), added in one
// transaction per answer before the answer is sent (AddResolvedCommands). Contract for their
// readers (the Host/SNI proxy's steering of TCP): an element says only that some name the
// sandbox may resolve pointed at the address; it is a hint, never an allowance by itself: a
// connection is allowed only after the proxy checks its Host/SNI against NameTable (this
// sandbox id, that name, that address). Elements are not removed with a sandbox (a set key
// cannot be deleted by prefix): they expire, and a later sandbox on the same veth name finds
// no NameTable entry behind them.
std::string AddResolvedCommands(const std::string& veth, const std::vector<IpPrefix>& addrs,
                                uint32_t ttl_s);
// Whether a policy chain of `allow` gets the domain-rule preamble and final reason above.
bool DomainRuled(const std::vector<EgressRule>& allow);
// The Host/SNI proxy's shared rules (conn_proxy.h), part of BaseRuleset when
// cfg.proxy_port is set:
//   chain prerouting (nat): TCP from an sbx veth to an address in `resolved4`/`resolved6` for
//     that veth (what sbxd's resolver answered a sandbox with domain rules; only such sandboxes
//     have elements there) is redirected to the proxy's port, so its name is checked;
//   chain input: those redirected connections (ct status dnat, source validated against
//     own4/own6) are accepted from sbx veths; the proxy's port is dropped from every other
//     interface but loopback (it relays as the sandbox that the source address names).
// ProxyInputRules goes before the input chain's final drops, ProxyPreroutingRules after the
// resolver's DNS redirect (the prerouting chain and the resolved sets are the DNS section's).
std::string ProxyInputRules(const NetPolicyConfig& cfg);
std::string ProxyPreroutingRules(const NetPolicyConfig& cfg);
// Under domain rules UDP is refused (reason udp_domain) after the CIDR allow rules: QUIC and
// other UDP cannot be checked by name. DNS to sbxd's resolver never gets here (it is
// redirected to the host in prerouting).
std::string UdpDomainRules(const std::string& chain);

// Sandbox ids are the only names put in rules: the generator refuses anything else (an id
// with a quote would break out of the ruleset text).
bool IsSafeName(const std::string& s);

}  // namespace sbx::net
