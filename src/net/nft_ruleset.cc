#include "net/limits.h"
#include "net/nft_ruleset.h"

#include <fmt/format.h>

#include "net/nflog.h"

namespace sbx::net {
namespace {

std::string Family(const IpPrefix& p) { return p.is_v4() ? "ip" : "ip6"; }

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

// The match of one rule: "ip daddr 203.0.113.0/24 tcp dport 443". A port range with protocol
// "any" becomes two rules (TCP and UDP): `th dport` would also match other protocols' bytes.
// A domain rule has no match here: its connections are checked by name in sbxd (the resolver and
// the Host/SNI proxy), never admitted by address alone.
std::vector<std::string> RuleMatches(const EgressRule& r) {
  if (r.is_domain()) return {};
  std::string dst = fmt::format("{} daddr {}", Family(r.dest), r.dest.ToString());
  if (r.any_port()) {
    if (r.protocol == Protocol::kAny) return {dst};
    return {fmt::format("{} meta l4proto {}", dst, r.protocol == Protocol::kTcp ? "tcp" : "udp")};
  }
  std::string ports = r.port_lo == r.port_hi ? fmt::format("{}", r.port_lo)
                                             : fmt::format("{}-{}", r.port_lo, r.port_hi);
  std::vector<std::string> out;
  if (r.protocol != Protocol::kUdp) out.push_back(fmt::format("{} tcp dport {}", dst, ports));
  if (r.protocol != Protocol::kTcp) out.push_back(fmt::format("{} udp dport {}", dst, ports));
  return out;
}

}  // namespace

const std::vector<std::string>& DenialReasons() {
  static const std::vector<std::string> kReasons = [] {
    std::vector<std::string> v = {kReasonSpoofed,    kReasonSandbox,    kReasonHost,
                                  kReasonDenyRule,   kReasonNotAllowed, kReasonDnsOther,
                                  kReasonUnresolved, kReasonUdpDomain,  kReasonConnLimit};
    for (const auto& b : AlwaysBlocked()) {
      bool seen = false;
      for (const auto& r : v) seen = seen || r == b.reason;
      if (!seen) v.push_back(b.reason);
    }
    return v;
  }();
  return kReasons;
}

bool IsSafeName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string ProfileChain(const std::string& name) { return "p_" + name; }

namespace {

// The log rule of a refusal, before its count: to NFLOG (nflog.h), at most kLogRate a second
// per sandbox (one meter element per veth), the reason in the prefix. Non-terminal.
std::string LogRule(const std::string& chain, const std::string& match, const std::string& reason) {
  return fmt::format(
      "add rule inet {} {} {}{}add @lograte {{ iifname limit rate 10/second burst 20 packets }} "
      "log prefix \"{}{}\" group {} snaplen {}\n",
      kTable, chain, match, match.empty() ? "" : " ", kNflogPrefix, reason, kNflogGroup, kNflogSnaplen);
}

// A refusal: logged (rate limited), counted in the sandbox's element of deny_REASON, then
// dropped (see the header).
void Refuse(std::string& out, const std::string& chain, const std::string& match,
            const std::string& reason) {
  out += LogRule(chain, match, reason);
  out += fmt::format("add rule inet {} {} {} iifname @deny_{}\n", kTable, chain, match, reason);
  out += fmt::format("add rule inet {} {} {} drop\n", kTable, chain, match);
}

// ---- DNS (nft_ruleset.h, DNS section) ----

// A domain-ruled chain: DNS goes to sbxd's resolver only (redirected before it gets here).
void DomainRuledPreamble(std::string& out, const std::string& chain) {
  Refuse(out, chain, "udp dport 53", kReasonDnsOther);
  Refuse(out, chain, "tcp dport 53", kReasonDnsOther);
}

// The redirect of DNS to sbxd's resolver and the input rule that lets exactly it in.
std::string DnsPreroutingRules(const NetPolicyConfig& cfg) {
  if (cfg.dns_port == 0) return "";
  std::string out;
  for (const char* proto : {"udp", "tcp"}) {
    out += fmt::format(
        "add rule inet {} prerouting iifname \"sbxv*\" fib daddr type local {} dport 53 "
        "redirect to :{}\n",
        kTable, proto, cfg.dns_port);
  }
  return out;
}
// Only from a sandbox's own address on its own veth (own4/own6): a veth with no elements (a
// pooled network no sandbox has claimed, docs/isolation.md §2.3b "Pooled") reaches not even the
// resolver, and a spoofed source is dropped before sbxd reads the query.
std::string DnsInputRules(const NetPolicyConfig& cfg) {
  if (cfg.dns_port == 0) return "";
  std::string out;
  for (const char* proto : {"udp", "tcp"}) {
    out += fmt::format(
        "add rule inet {t} input iifname \"sbxv*\" meta nfproto ipv4 ct status dnat {p} dport {d} "
        "iifname . ip saddr @own4 accept\n"
        "add rule inet {t} input iifname \"sbxv*\" meta nfproto ipv6 ct status dnat {p} dport {d} "
        "iifname . ip6 saddr @own6 accept\n",
        fmt::arg("t", kTable), fmt::arg("p", proto), fmt::arg("d", cfg.dns_port));
  }
  return out;
}

// A profile's deny rules, allow rules and final drop, into `chain`.
void PolicyRules(std::string& out, const std::string& chain, const std::vector<EgressRule>& deny,
                 const std::vector<EgressRule>& allow) {
  const bool domain_ruled = DomainRuled(allow);
  if (domain_ruled) DomainRuledPreamble(out, chain);
  for (const auto& d : deny) {
    for (const auto& m : RuleMatches(d)) Refuse(out, chain, m, kReasonDenyRule);
  }
  for (const auto& a : allow) {
    for (const auto& m : RuleMatches(a)) out += fmt::format("add rule inet {} {} {} accept\n", kTable, chain, m);
  }
  if (domain_ruled) out += UdpDomainRules(chain);
  const char* last = domain_ruled ? kReasonUnresolved : kReasonNotAllowed;
  out += LogRule(chain, "", last);
  out += fmt::format("add rule inet {} {} iifname @deny_{}\n", kTable, chain, last);
  out += fmt::format("add rule inet {} {} drop\n", kTable, chain);
}

std::vector<EgressProfile> NetworkedProfiles(const NetPolicyConfig& cfg) {
  std::vector<EgressProfile> v = {OpenProfile()};
  for (const auto& p : cfg.profiles) {
    if (p.networked && p.name != "open") v.push_back(p);
  }
  return v;
}

}  // namespace

// What a microVM's guest sends, forwarded or to the host, beyond egress.rate_mbit is dropped
// (the bucket holds the shaper's burst and queue: ~70 ms at the rate, so TCP's bursts pass).
std::string TapRateRules(const NetPolicyConfig& cfg) {
  if (cfg.rate_mbit == 0) return "";
  const RateParams p = RateParamsFor(cfg.rate_mbit);
  std::string out;
  for (const char* chain : {"forward", "input"}) {
    out += fmt::format("add rule inet {} {} iifname @taps update @tap_rate {{ iifname limit rate over {} "
                       "bytes/second burst {} bytes }} drop\n",
                       kTable, chain, p.bytes_per_s, static_cast<uint64_t>(p.burst) + p.queue);
  }
  return out;
}

std::string BaseRuleset(const NetPolicyConfig& cfg) {
  const char* t = kTable;
  std::string out = fmt::format(
      "add table inet {t}\n"
      "add map inet {t} profile_of {{ type ifname : verdict; }}\n"
      "add set inet {t} own4 {{ type ifname . ipv4_addr; }}\n"
      "add set inet {t} own6 {{ type ifname . ipv6_addr; }}\n"
      "add chain inet {t} forward {{ type filter hook forward priority filter; policy accept; }}\n"
      "add chain inet {t} input {{ type filter hook input priority filter; policy accept; }}\n"
      "add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
      "add chain inet {t} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}\n"
      "add set inet {t} resolved4 {{ type ifname . ipv4_addr; flags timeout; }}\n"
      "add set inet {t} resolved6 {{ type ifname . ipv6_addr; flags timeout; }}\n"
      "add chain inet {t} egress\n",
      fmt::arg("t", t));
  for (const auto& reason : DenialReasons()) {
    out += fmt::format("add set inet {} deny_{} {{ type ifname; counter; }}\n", t, reason);
  }
  out += fmt::format("add set inet {} lograte {{ type ifname; size {}; flags dynamic; }}\n", t,
                     AddrPool::kMaxSlots);
  // microVM taps (AddSandboxRuleset's `tap`) and, per tap, the token bucket of what its guest
  // sends: a policer, since no qdisc sees those packets before the host routes them.
  out += fmt::format("add set inet {} taps {{ type ifname; }}\n", t);
  out += fmt::format("add set inet {} tap_rate {{ type ifname; size {}; flags dynamic,timeout; timeout 1m; }}\n", t,
                     AddrPool::kMaxSlots);
  for (const auto& p : NetworkedProfiles(cfg)) out += fmt::format("add chain inet {} {}\n", t, ProfileChain(p.name));
  for (const char* c : {"forward", "input", "postrouting", "prerouting", "egress"}) {
    out += fmt::format("flush chain inet {} {}\n", t, c);
  }
  for (const auto& p : NetworkedProfiles(cfg)) out += fmt::format("flush chain inet {} {}\n", t, ProfileChain(p.name));
  out += TapRateRules(cfg);
  out += fmt::format(
      "add rule inet {t} forward iifname \"sbxv*\" jump egress\n"
      "add rule inet {t} forward oifname \"sbxv*\" ct state established,related accept\n"
      "add rule inet {t} forward oifname \"sbxv*\" drop\n"
      "add rule inet {t} input iifname \"sbxv*\" ct state established,related accept\n"
      "add rule inet {t} input iifname \"sbxv*\" icmpv6 type {{ nd-neighbor-solicit, "
      "nd-neighbor-advert, nd-router-solicit }} accept\n",
      fmt::arg("t", t));
  out += DnsInputRules(cfg);
  out += DnsPreroutingRules(cfg);
  out += ProxyInputRules(cfg);
  out += LogRule("input", "iifname \"sbxv*\"", kReasonHost);
  out += fmt::format(
      "add rule inet {t} input iifname \"sbxv*\" iifname @deny_{host}\n"
      "add rule inet {t} input iifname \"sbxv*\" drop\n",
      fmt::arg("t", t), fmt::arg("host", kReasonHost));
  Refuse(out, "egress", "meta nfproto ipv4 iifname . ip saddr != @own4", kReasonSpoofed);
  Refuse(out, "egress", "meta nfproto ipv6 iifname . ip6 saddr != @own6", kReasonSpoofed);
  Refuse(out, "egress", fmt::format("ip daddr {}", cfg.pool4.ToString()), kReasonSandbox);
  Refuse(out, "egress", fmt::format("ip6 daddr {}", cfg.pool6.ToString()), kReasonSandbox);
  std::vector<std::string> exempt4, exempt6;
  for (const auto& e : cfg.exempt) (e.is_v4() ? exempt4 : exempt6).push_back(e.ToString());
  for (const auto& b : AlwaysBlocked()) {
    std::string match = fmt::format("{} daddr {}", Family(b.range), b.range.ToString());
    const auto& ex = b.range.is_v4() ? exempt4 : exempt6;
    if (b.reason != "metadata" && !ex.empty()) {
      match = fmt::format("{} daddr != {{ {} }} {}", Family(b.range), Join(ex), match);
    }
    Refuse(out, "egress", match, b.reason);
  }
  for (const auto& d : cfg.operator_deny) {
    Refuse(out, "egress", fmt::format("{} daddr {}", Family(d), d.ToString()), kReasonDenyRule);
  }
  out += ConnLimitRules(cfg);
  out += fmt::format("add rule inet {} egress iifname vmap @profile_of\n", t);
  out += fmt::format("add rule inet {} egress drop\n", t);  // a veth without a profile: a leftover
  for (const auto& p : NetworkedProfiles(cfg)) PolicyRules(out, ProfileChain(p.name), p.deny, p.allow);
  std::string oif = cfg.uplink.empty() ? "" : fmt::format("oifname \"{}\" ", cfg.uplink);
  out += ProxyPreroutingRules(cfg);
  out += fmt::format("add rule inet {} postrouting {}ip saddr {} masquerade\n", t, oif, cfg.pool4.ToString());
  out += fmt::format("add rule inet {} postrouting {}ip6 saddr {} masquerade\n", t, oif, cfg.pool6.ToString());
  return out;
}

std::string ProxyInputRules(const NetPolicyConfig& cfg) {
  if (cfg.proxy_port == 0) return "";
  return fmt::format(
      "add rule inet {t} input iifname \"sbxv*\" meta nfproto ipv4 tcp dport {p} ct status dnat "
      "iifname . ip saddr @own4 accept\n"
      "add rule inet {t} input iifname \"sbxv*\" meta nfproto ipv6 tcp dport {p} ct status dnat "
      "iifname . ip6 saddr @own6 accept\n"
      "add rule inet {t} input iifname != \"sbxv*\" iifname != \"lo\" tcp dport {p} drop\n",
      fmt::arg("t", kTable), fmt::arg("p", cfg.proxy_port));
}

std::string ProxyPreroutingRules(const NetPolicyConfig& cfg) {
  if (cfg.proxy_port == 0) return "";
  return fmt::format(
      "add rule inet {t} prerouting iifname \"sbxv*\" iifname . ip daddr @resolved4 "
      "meta l4proto tcp redirect to :{p}\n"
      "add rule inet {t} prerouting iifname \"sbxv*\" iifname . ip6 daddr @resolved6 "
      "meta l4proto tcp redirect to :{p}\n",
      fmt::arg("t", kTable), fmt::arg("p", cfg.proxy_port));
}

std::string UdpDomainRules(const std::string& chain) {
  std::string out;
  Refuse(out, chain, "meta l4proto udp", kReasonUdpDomain);
  return out;
}

std::string AddSandboxRuleset(const std::string& id, const std::string& veth,
                              const SandboxAddrs& addrs, const NetPolicyConfig& cfg,
                              const SandboxPolicy& policy, bool tap) {
  const char* t = kTable;
  std::string out;
  if (tap) out += AddTapElement(veth);
  for (const auto& reason : DenialReasons()) {
    out += fmt::format("add element inet {} deny_{} {{ \"{}\" }}\n", t, reason, veth);
  }
  out += fmt::format("add element inet {} own4 {{ \"{}\" . {} }}\n", t, veth, addrs.sandbox4.AddressString());
  out += fmt::format("add element inet {} own6 {{ \"{}\" . {} }}\n", t, veth, addrs.sandbox6.AddressString());
  std::string target = ProfileChain(policy.profile);
  if (policy.narrowed.has_value()) {
    const EgressProfile* profile = nullptr;
    for (const auto& p : cfg.profiles) {
      if (p.name == policy.profile) profile = &p;
    }
    std::vector<EgressRule> deny = profile ? profile->deny : std::vector<EgressRule>{};
    out += fmt::format("add chain inet {} {}\nflush chain inet {} {}\n", t, id, t, id);
    PolicyRules(out, id, deny, *policy.narrowed);
    target = id;
  }
  out += fmt::format("add element inet {} profile_of {{ \"{}\" : jump {} }}\n", t, veth, target);
  return out;
}

std::string PatchSandboxRuleset(const std::string& id, const std::string& veth,
                                const NetPolicyConfig& cfg, const std::string& profile,
                                const std::vector<EgressRule>& allow, bool has_own_chain) {
  const char* t = kTable;
  std::vector<EgressRule> deny;
  for (const auto& p : cfg.profiles) {
    if (p.name == profile) deny = p.deny;
  }
  // Flushing and refilling in one transaction: no packet ever sees the chain half-written.
  std::string out = fmt::format("add chain inet {} {}\nflush chain inet {} {}\n", t, id, t, id);
  PolicyRules(out, id, deny, allow);
  if (!has_own_chain) {
    // A map element's verdict cannot be changed in place: replaced within the transaction.
    out += fmt::format("delete element inet {} profile_of {{ \"{}\" }}\n", t, veth);
    out += fmt::format("add element inet {} profile_of {{ \"{}\" : jump {} }}\n", t, veth, id);
  }
  return out;
}

std::string ConnLimitRules(const NetPolicyConfig& cfg) {
  if (cfg.max_connections == 0) return "";
  const char* t = kTable;
  // Only new flows are looked at: an established one already holds its place. An element
  // outlives its sandbox (a dynamic set's elements cannot be deleted by key without knowing
  // they exist); the next sandbox on that veth name finds its list empty, since ct count
  // drops entries whose conntrack is gone.
  std::string out = fmt::format("add set inet {} conns {{ type ifname; size {}; flags dynamic; }}\n",
                                t, AddrPool::kMaxSlots);
  // One evaluation per packet: `ct count` evaluated twice for one new flow (a Refuse pair)
  // counts it twice on this kernel, so the refusal is a chain of its own.
  out += fmt::format("add chain inet {t} conn_limit\nflush chain inet {t} conn_limit\n", fmt::arg("t", t));
  Refuse(out, "conn_limit", "", kReasonConnLimit);
  out += fmt::format("add rule inet {} egress ct state new add @conns {{ iifname ct count over {} }} "
                     "jump conn_limit\n",
                     t, cfg.max_connections);
  return out;
}

std::string AddTapElement(const std::string& veth) {
  return fmt::format("add element inet {} taps {{ \"{}\" }}\n", kTable, veth);
}

std::vector<std::string> DeleteSandboxCommands(const std::string& id, const std::string& veth,
                                               const SandboxAddrs& addrs, bool narrowed, bool tap) {
  const char* t = kTable;
  // The map element first: it is the last reference to a narrowed sandbox's chain.
  std::vector<std::string> out = {
      fmt::format("delete element inet {} profile_of {{ \"{}\" }}", t, veth)};
  if (narrowed) out.push_back(fmt::format("flush chain inet {} {}\ndelete chain inet {} {}", t, id, t, id));
  out.push_back(fmt::format("delete element inet {} own4 {{ \"{}\" . {} }}", t, veth, addrs.sandbox4.AddressString()));
  out.push_back(fmt::format("delete element inet {} own6 {{ \"{}\" . {} }}", t, veth, addrs.sandbox6.AddressString()));
  for (const auto& reason : DenialReasons()) {
    out.push_back(fmt::format("delete element inet {} deny_{} {{ \"{}\" }}", t, reason, veth));
  }
  if (tap) out.push_back(fmt::format("delete element inet {} taps {{ \"{}\" }}", t, veth));
  return out;
}

// ---- DNS (nft_ruleset.h, DNS section) ----

bool DomainRuled(const std::vector<EgressRule>& allow) { return HasDomainRules(allow); }

std::string AddResolvedCommands(const std::string& veth, const std::vector<IpPrefix>& addrs,
                                uint32_t ttl_s) {
  // add, delete, add: `add` of an element already there keeps its old timeout; deleting and
  // adding it again in the same transaction gives it the new one, without a moment between.
  std::string out;
  for (int v4 = 1; v4 >= 0; --v4) {
    std::string keys;
    for (const auto& a : addrs) {
      if (a.is_v4() != (v4 == 1)) continue;
      if (!keys.empty()) keys += ", ";
      keys += fmt::format("\"{}\" . {}", veth, a.AddressString());
    }
    if (keys.empty()) continue;
    const char* set = v4 ? "resolved4" : "resolved6";
    out += fmt::format("add element inet {} {} {{ {} }}\n", kTable, set, keys);
    out += fmt::format("delete element inet {} {} {{ {} }}\n", kTable, set, keys);
    std::string timed;
    for (const auto& a : addrs) {
      if (a.is_v4() != (v4 == 1)) continue;
      if (!timed.empty()) timed += ", ";
      timed += fmt::format("\"{}\" . {} timeout {}s", veth, a.AddressString(), ttl_s);
    }
    out += fmt::format("add element inet {} {} {{ {} }}\n", kTable, set, timed);
  }
  return out;
}

}  // namespace sbx::net
