#include "net/nft_ruleset.h"

#include <fmt/format.h>

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
std::vector<std::string> RuleMatches(const EgressRule& r) {
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
    std::vector<std::string> v = {kReasonSpoofed, kReasonSandbox, kReasonHost, kReasonDenyRule,
                                  kReasonNotAllowed};
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

std::string BaseRuleset(const NetPolicyConfig& cfg) {
  std::string out = fmt::format(
      "add table inet {t}\n"
      "add map inet {t} from_sandbox {{ type ifname : verdict; }}\n"
      "add map inet {t} to_host {{ type ifname : verdict; }}\n"
      "add chain inet {t} forward {{ type filter hook forward priority filter; policy accept; }}\n"
      "add chain inet {t} input {{ type filter hook input priority filter; policy accept; }}\n"
      "add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
      "flush chain inet {t} forward\n"
      "flush chain inet {t} input\n"
      "flush chain inet {t} postrouting\n"
      "add rule inet {t} forward iifname vmap @from_sandbox\n"
      "add rule inet {t} forward iifname \"sbxv*\" drop\n"
      "add rule inet {t} forward oifname \"sbxv*\" ct state established,related accept\n"
      "add rule inet {t} forward oifname \"sbxv*\" drop\n"
      "add rule inet {t} input iifname \"sbxv*\" ct state established,related accept\n"
      "add rule inet {t} input iifname \"sbxv*\" icmpv6 type {{ nd-neighbor-solicit, "
      "nd-neighbor-advert, nd-router-solicit }} accept\n"
      "add rule inet {t} input iifname vmap @to_host\n"
      "add rule inet {t} input iifname \"sbxv*\" drop\n",
      fmt::arg("t", kTable));
  std::string oif = cfg.uplink.empty() ? "" : fmt::format("oifname \"{}\" ", cfg.uplink);
  out += fmt::format("add rule inet {} postrouting {}ip saddr {} masquerade\n", kTable, oif,
                     cfg.pool4.ToString());
  out += fmt::format("add rule inet {} postrouting {}ip6 saddr {} masquerade\n", kTable, oif,
                     cfg.pool6.ToString());
  return out;
}

std::string AddSandboxRuleset(const std::string& id, const std::string& veth,
                              const SandboxAddrs& addrs, const NetPolicyConfig& cfg,
                              const SandboxPolicy& policy) {
  const char* t = kTable;
  std::string out;
  for (const auto& reason : DenialReasons()) {
    out += fmt::format("add counter inet {} {}__{}\n", t, id, reason);
  }
  out += fmt::format("add chain inet {} {}\nflush chain inet {} {}\n", t, id, t, id);
  out += fmt::format("add chain inet {} {}_in\nflush chain inet {} {}_in\n", t, id, t, id);
  auto rule = [&](const std::string& match, const std::string& reason) {
    out += fmt::format("add rule inet {} {} {} counter name \"{}__{}\" drop\n", t, id, match, id,
                       reason);
  };
  rule(fmt::format("meta nfproto ipv4 ip saddr != {}", addrs.sandbox4.AddressString()), kReasonSpoofed);
  rule(fmt::format("meta nfproto ipv6 ip6 saddr != {}", addrs.sandbox6.AddressString()), kReasonSpoofed);
  rule(fmt::format("ip daddr {}", cfg.pool4.ToString()), kReasonSandbox);
  rule(fmt::format("ip6 daddr {}", cfg.pool6.ToString()), kReasonSandbox);
  std::vector<std::string> exempt4, exempt6;
  for (const auto& e : cfg.exempt) (e.is_v4() ? exempt4 : exempt6).push_back(e.ToString());
  for (const auto& b : AlwaysBlocked()) {
    std::string match = fmt::format("{} daddr {}", Family(b.range), b.range.ToString());
    const auto& ex = b.range.is_v4() ? exempt4 : exempt6;
    if (b.reason != "metadata" && !ex.empty()) {
      match = fmt::format("{} daddr != {{ {} }} {}", Family(b.range), Join(ex), match);
    }
    rule(match, b.reason);
  }
  for (const auto& d : cfg.operator_deny) {
    rule(fmt::format("{} daddr {}", Family(d), d.ToString()), kReasonDenyRule);
  }
  for (const auto& d : policy.deny) {
    for (const auto& m : RuleMatches(d)) rule(m, kReasonDenyRule);
  }
  for (const auto& a : policy.allow) {
    for (const auto& m : RuleMatches(a)) out += fmt::format("add rule inet {} {} {} accept\n", t, id, m);
  }
  out += fmt::format("add rule inet {} {} counter name \"{}__{}\" drop\n", t, id, id, kReasonNotAllowed);
  out += fmt::format("add rule inet {} {}_in counter name \"{}__{}\" drop\n", t, id, id, kReasonHost);
  out += fmt::format("add element inet {} from_sandbox {{ \"{}\" : jump {} }}\n", t, veth, id);
  out += fmt::format("add element inet {} to_host {{ \"{}\" : jump {}_in }}\n", t, veth, id);
  return out;
}

std::string DeleteSandboxRuleset(const std::string& id, const std::string& veth) {
  const char* t = kTable;
  std::string out;
  if (!veth.empty()) {
    out += fmt::format("delete element inet {} from_sandbox {{ \"{}\" }}\n", t, veth);
    out += fmt::format("delete element inet {} to_host {{ \"{}\" }}\n", t, veth);
  }
  // Rules go before their chain, and with them the last references to the counters.
  out += fmt::format("flush chain inet {} {}\ndelete chain inet {} {}\n", t, id, t, id);
  out += fmt::format("flush chain inet {} {}_in\ndelete chain inet {} {}_in\n", t, id, t, id);
  for (const auto& reason : DenialReasons()) {
    out += fmt::format("delete counter inet {} {}__{}\n", t, id, reason);
  }
  return out;
}

}  // namespace sbx::net
