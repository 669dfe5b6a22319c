#include "net/dns_policy.h"

#include <netinet/in.h>

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

namespace sbx::net {

bool MayResolve(const std::vector<EgressRule>& allow, const std::vector<EgressRule>& deny,
                const std::string& name) {
  return !name.empty() && NameAllowed(allow, deny, name, 0);
}

std::string RefusedAnswerReason(const NetPolicyConfig& cfg, const IpPrefix& addr) {
  if (cfg.pool4.family == addr.family && cfg.pool4.Contains(addr)) return kReasonSandbox;
  if (cfg.pool6.family == addr.family && cfg.pool6.Contains(addr)) return kReasonSandbox;
  for (const auto& b : AlwaysBlocked()) {
    if (b.range.family != addr.family || !b.range.Contains(addr)) continue;
    bool exempt = false;
    if (b.reason != "metadata") {
      for (const auto& e : cfg.exempt) exempt = exempt || (e.family == addr.family && e.Contains(addr));
    }
    if (!exempt) return b.reason;
  }
  for (const auto& d : cfg.operator_deny) {
    if (d.family == addr.family && d.Contains(addr)) return kReasonDenyRule;
  }
  return "";
}

CheckedAnswer CheckAnswer(const NetPolicyConfig& cfg, std::vector<dns::Record> chain) {
  CheckedAnswer out;
  uint32_t ttl = kDnsMaxTtl;
  for (auto& r : chain) {
    if (r.type == dns::kTypeA || r.type == dns::kTypeAaaa) {
      std::string reason = RefusedAnswerReason(cfg, r.addr);
      if (!reason.empty()) {
        out.stripped.emplace_back(r.addr, std::move(reason));
        continue;
      }
      if (std::find(out.addrs.begin(), out.addrs.end(), r.addr) == out.addrs.end()) {
        out.addrs.push_back(r.addr);
      }
    }
    ttl = std::min(ttl, r.ttl);
    r.ttl = std::min(r.ttl, kDnsMaxTtl);
    out.records.push_back(std::move(r));
  }
  out.ttl = std::clamp(ttl, kDnsMinTtl, kDnsMaxTtl);
  return out;
}

std::string DnsUpstream::ToString() const {
  return addr.is_v4() ? fmt::format("{}:{}", addr.AddressString(), port)
                      : fmt::format("[{}]:{}", addr.AddressString(), port);
}

namespace {

absl::StatusOr<DnsUpstream> ParseUpstream(std::string item, const std::string& field) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(fmt::format("{}: \"{}\": {}", field, item, why));
  };
  std::string host = item;
  std::string port;
  if (!item.empty() && item[0] == '[') {
    const size_t close = item.find(']');
    if (close == std::string::npos) return bad("an IPv6 address in [ ] lacks its ]");
    host = item.substr(1, close - 1);
    if (close + 1 < item.size()) {
      if (item[close + 1] != ':') return bad("expected :PORT after ]");
      port = item.substr(close + 2);
    }
  } else if (std::count(item.begin(), item.end(), ':') == 1) {
    host = item.substr(0, item.find(':'));
    port = item.substr(item.find(':') + 1);
  }
  auto addr = IpPrefix::Parse(host);
  if (!addr.ok() || addr->len != addr->bits()) return bad("not an IP address");
  DnsUpstream u;
  u.addr = *addr;
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return bad("port is not a number");
    }
    const int p = std::stoi(port);
    if (p < 1 || p > 65535) return bad("port out of 1-65535");
    u.port = static_cast<uint16_t>(p);
  }
  return u;
}

}  // namespace

absl::StatusOr<std::vector<DnsUpstream>> ParseUpstreams(const std::string& text,
                                                        const std::string& field) {
  std::vector<DnsUpstream> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    auto u = ParseUpstream(item, field);
    if (!u.ok()) return u.status();
    out.push_back(*u);
  }
  if (out.size() > 8) return absl::InvalidArgumentError(fmt::format("{}: at most 8 upstreams", field));
  return out;
}

std::vector<DnsUpstream> UpstreamsOfResolvConf(const std::string& text) {
  std::vector<DnsUpstream> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line) && out.size() < 3) {
    std::stringstream ls(line);
    std::string key, value;
    ls >> key >> value;
    if (key != "nameserver") continue;
    // A scoped link-local address ("fe80::1%eth0") cannot be parsed and is skipped.
    auto addr = IpPrefix::Parse(value);
    if (!addr.ok() || addr->len != addr->bits()) continue;
    out.push_back(DnsUpstream{*addr, 53});
  }
  return out;
}

std::string SandboxResolvConf(const IpPrefix& host4, const IpPrefix& host6) {
  // sbxd's resolver answers on the host end of the sandbox's veth (nft redirects port 53 there
  // to it). No search domain: the host's would leak its internal names into every lookup.
  return fmt::format(
      "# sbx: the resolver of sbxd, which answers only names this sandbox's egress rules allow\n"
      "nameserver {}\nnameserver {}\noptions timeout:2 attempts:2\n",
      host4.AddressString(), host6.AddressString());
}

}  // namespace sbx::net
