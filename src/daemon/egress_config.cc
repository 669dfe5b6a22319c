#include "daemon/egress_config.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "daemon/config_internal.h"
#include "net/addr_pool.h"

namespace sbx::daemon {

using namespace config_internal;

namespace {

// "a, b,c" -> the prefixes; an error names the key and the entry.
std::vector<net::IpPrefix> ParseList(const Config& c, const char* path,
                                     std::vector<std::string>& errors) {
  std::vector<net::IpPrefix> out;
  const std::string& text = Str(c, *FindKey(path));
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) {
      auto p = net::IpPrefix::Parse(item);
      if (!p.ok()) {
        errors.push_back(fmt::format("{}: '{}': {}", LabelOf(c, *FindKey(path)), item,
                                     std::string(p.status().message())));
      } else {
        out.push_back(*p);
      }
    }
    start = comma + 1;
  }
  return out;
}

}  // namespace

absl::StatusOr<EgressSetup> EgressFromConfig(const Config& c) {
  std::vector<std::string> errors;
  net::NetPolicyConfig policy;
  auto pool = [&](const char* path, bool v4, net::IpPrefix& out) {
    const KeyInfo& k = *FindKey(path);
    auto p = net::IpPrefix::Parse(Str(c, k));
    if (!p.ok()) {
      errors.push_back(fmt::format("{}: {}", LabelOf(c, k), std::string(p.status().message())));
    } else if (p->is_v4() != v4) {
      errors.push_back(fmt::format("{}: expected an {} range", LabelOf(c, k), v4 ? "IPv4" : "IPv6"));
    } else {
      out = *p;
    }
  };
  pool("egress.pool_v4", true, policy.pool4);
  pool("egress.pool_v6", false, policy.pool6);
  if (errors.empty()) {
    if (auto p = net::AddrPool::Make(policy.pool4, policy.pool6); !p.ok()) {
      errors.push_back(fmt::format("{} / {}: {}", LabelOf(c, *FindKey("egress.pool_v4")),
                                   LabelOf(c, *FindKey("egress.pool_v6")),
                                   std::string(p.status().message())));
    }
  }
  policy.exempt = ParseList(c, "egress.exempt", errors);
  policy.operator_deny = ParseList(c, "egress.deny", errors);
  policy.uplink = c.egress.uplink;
  policy.proxy_port = static_cast<uint16_t>(c.egress.proxy_port);
  policy.max_connections = static_cast<uint32_t>(c.egress.max_connections);
  policy.rate_mbit = static_cast<uint32_t>(c.egress.rate_mbit);
  if (policy.uplink.size() > 15 ||
      policy.uplink.find_first_of("\"'\\ /\t\n") != std::string::npos) {
    errors.push_back(fmt::format("{}: not an interface name (at most 15 characters, no quotes, "
                                 "spaces or slashes)",
                                 LabelOf(c, *FindKey("egress.uplink"))));
  }
  policy.dns_port = static_cast<uint16_t>(c.egress.dns_port);
  std::vector<net::DnsUpstream> upstreams;
  if (auto u = net::ParseUpstreams(c.egress.dns_upstream, LabelOf(c, *FindKey("egress.dns_upstream")));
      !u.ok()) {
    errors.push_back(std::string(u.status().message()));
  } else {
    upstreams = std::move(*u);
  }
  auto catalog = net::ProfileCatalog::FromJson(c.egress.profiles);
  if (!catalog.ok()) {
    errors.push_back(std::string(catalog.status().message()));
  }
  if (auto st = Errors(errors); !st.ok()) return st;
  policy.profiles = catalog->configured();
  return EgressSetup{std::move(policy), std::move(*catalog), std::move(upstreams)};
}

}  // namespace sbx::daemon
