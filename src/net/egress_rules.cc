#include "net/egress_rules.h"

#include <charconv>

#include <fmt/format.h>

#include "absl/status/status.h"
#include "common/status_util.h"

namespace sbx::net {
namespace {

using Json = nlohmann::json;

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", field, why));
}

absl::StatusOr<uint16_t> ParsePort(std::string_view text, std::string_view field) {
  unsigned v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || text.size() > 5 || ec != std::errc() || ptr != text.data() + text.size()) {
    return Bad(field, fmt::format("'{}' is not a port number", text));
  }
  if (v < 1 || v > 65535) return Bad(field, fmt::format("port {} is out of range 1-65535", v));
  return static_cast<uint16_t>(v);
}

std::string_view ProtocolName(Protocol p) {
  switch (p) {
    case Protocol::kTcp: return "tcp";
    case Protocol::kUdp: return "udp";
    case Protocol::kAny: break;
  }
  return "any";
}

}  // namespace

bool EgressRule::WithinRule(const EgressRule& wider) const {
  if (!wider.dest.Contains(dest)) return false;
  if (wider.protocol != Protocol::kAny && wider.protocol != protocol) return false;
  if (wider.any_port()) return true;
  // A port-limited rule covers no protocol without ports (ICMP), so "any" cannot fit in it.
  if (any_port() || (protocol == Protocol::kAny && wider.protocol != Protocol::kAny)) return false;
  return port_lo >= wider.port_lo && port_hi <= wider.port_hi;
}

Json EgressRule::ToJson() const {
  Json j = {{"cidr", dest.ToString()}, {"protocol", std::string(ProtocolName(protocol))}};
  if (!any_port()) {
    j["ports"] = port_lo == port_hi ? fmt::format("{}", port_lo)
                                    : fmt::format("{}-{}", port_lo, port_hi);
  }
  return j;
}

absl::StatusOr<EgressRule> ParseRule(const Json& j, std::string_view field) {
  if (!j.is_object()) return Bad(field, "a rule is an object such as {\"cidr\": \"203.0.113.0/24\"}");
  if (j.contains("domain") || j.contains("host")) {
    return Bad(field,
               "domain rules are not supported yet: they need sbx's DNS resolver and the "
               "Host/SNI check on each connection (issue 16, a later release); use \"cidr\"");
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "cidr" && key != "ports" && key != "protocol") {
      return Bad(field, fmt::format("unknown key '{}' (a rule has cidr, ports, protocol)", key));
    }
  }
  if (!j.contains("cidr") || !j["cidr"].is_string()) {
    return Bad(field, "\"cidr\" (a string such as \"203.0.113.0/24\") is required");
  }
  EgressRule r;
  std::string cidr_field = fmt::format("{}.cidr", field);
  auto prefix = IpPrefix::Parse(j["cidr"].get_ref<const std::string&>());
  if (!prefix.ok()) return Bad(cidr_field, std::string(prefix.status().message()));
  r.dest = *prefix;
  if (j.contains("protocol")) {
    const Json& p = j["protocol"];
    std::string pf = fmt::format("{}.protocol", field);
    if (!p.is_string()) return Bad(pf, "a string: tcp, udp or any");
    const std::string& s = p.get_ref<const std::string&>();
    if (s == "tcp") r.protocol = Protocol::kTcp;
    else if (s == "udp") r.protocol = Protocol::kUdp;
    else if (s == "any") r.protocol = Protocol::kAny;
    else return Bad(pf, fmt::format("'{}' is not tcp, udp or any", s.substr(0, 16)));
  }
  if (j.contains("ports")) {
    const Json& p = j["ports"];
    std::string pf = fmt::format("{}.ports", field);
    if (p.is_number_integer()) {
      int64_t v = p.get<int64_t>();
      if (v < 1 || v > 65535) return Bad(pf, fmt::format("port {} is out of range 1-65535", v));
      r.port_lo = r.port_hi = static_cast<uint16_t>(v);
    } else if (p.is_string()) {
      const std::string& s = p.get_ref<const std::string&>();
      size_t dash = s.find('-');
      std::string_view sv(s);
      SBX_ASSIGN_OR_RETURN(r.port_lo, ParsePort(sv.substr(0, dash), pf));
      if (dash == std::string::npos) {
        r.port_hi = r.port_lo;
      } else {
        SBX_ASSIGN_OR_RETURN(r.port_hi, ParsePort(sv.substr(dash + 1), pf));
        if (r.port_hi < r.port_lo) return Bad(pf, fmt::format("range '{}' ends before it starts", s));
      }
    } else {
      return Bad(pf, "a port (443) or a range (\"8000-8100\")");
    }
  }
  return r;
}

absl::StatusOr<std::vector<EgressRule>> ParseRules(const Json& j, std::string_view field) {
  if (!j.is_array()) return Bad(field, "a list of rules");
  if (j.size() > 256) return Bad(field, fmt::format("{} rules, at most 256", j.size()));
  std::vector<EgressRule> out;
  for (size_t i = 0; i < j.size(); ++i) {
    SBX_ASSIGN_OR_RETURN(EgressRule r, ParseRule(j[i], fmt::format("{}[{}]", field, i)));
    out.push_back(r);
  }
  return out;
}

Json EgressProfile::ToJson() const {
  Json rules = Json::array();
  for (const auto& r : deny) {
    Json j = r.ToJson();
    j["action"] = "deny";
    rules.push_back(std::move(j));
  }
  for (const auto& r : allow) {
    Json j = r.ToJson();
    j["action"] = "allow";
    rules.push_back(std::move(j));
  }
  return {{"name", name}, {"description", description}, {"rules", std::move(rules)}};
}

EgressProfile NoneProfile() {
  return {.name = "none", .description = "loopback only: no route out, no DNS"};
}

EgressProfile OpenProfile() {
  EgressProfile p{.name = "open",
                  .description = "the public internet, minus the ranges sbx always blocks",
                  .networked = true};
  p.allow.push_back({.dest = *IpPrefix::Parse("0.0.0.0/0")});
  p.allow.push_back({.dest = *IpPrefix::Parse("::/0")});
  return p;
}

absl::StatusOr<EgressProfile> ParseProfile(std::string_view name, const Json& j) {
  std::string field = fmt::format("egress.profiles.{}", name);
  if (name.empty() || name.size() > 63 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string_view::npos) {
    // The name becomes an nftables chain name (p_NAME): only characters it takes unquoted.
    return Bad(field, "a profile name is 1-63 of a-z, 0-9 and '_'");
  }
  if (name == "none" || name == "open") return Bad(field, "'none' and 'open' are built in");
  if (!j.is_object()) return Bad(field, "a table with description, allow and deny");
  for (const auto& [key, value] : j.items()) {
    if (key != "description" && key != "allow" && key != "deny") {
      return Bad(field, fmt::format("unknown key '{}' (a profile has description, allow, deny)", key));
    }
  }
  EgressProfile p{.name = std::string(name), .networked = true};
  if (j.contains("description")) {
    if (!j["description"].is_string()) return Bad(field + ".description", "a string");
    p.description = j["description"].get<std::string>();
  }
  if (j.contains("allow")) {
    SBX_ASSIGN_OR_RETURN(p.allow, ParseRules(j["allow"], field + ".allow"));
  }
  if (j.contains("deny")) {
    SBX_ASSIGN_OR_RETURN(p.deny, ParseRules(j["deny"], field + ".deny"));
  }
  return p;
}

absl::StatusOr<std::vector<EgressRule>> ParseNarrowing(const EgressProfile& profile,
                                                       const Json& egress) {
  if (!egress.is_object()) return Bad("egress", "an object such as {\"allow\": [rules]}");
  for (const auto& [key, value] : egress.items()) {
    if (key != "allow") return Bad("egress", fmt::format("unknown key '{}' (egress has allow)", key));
  }
  if (!egress.contains("allow")) return Bad("egress.allow", "required");
  if (!profile.networked) {
    return Bad("egress", fmt::format("profile '{}' reaches nothing: there is nothing to narrow",
                                     profile.name));
  }
  SBX_ASSIGN_OR_RETURN(std::vector<EgressRule> rules, ParseRules(egress["allow"], "egress.allow"));
  for (size_t i = 0; i < rules.size(); ++i) {
    bool within = false;
    for (const auto& a : profile.allow) within = within || rules[i].WithinRule(a);
    if (!within) {
      return Bad(fmt::format("egress.allow[{}]", i),
                 fmt::format("{} would widen profile '{}': each rule must lie within one of its "
                             "allow rules",
                             rules[i].ToJson().dump(), profile.name));
    }
  }
  return rules;
}

const std::vector<BlockedRange>& AlwaysBlocked() {
  static const std::vector<BlockedRange> kRanges = [] {
    const std::pair<const char*, const char*> table[] = {
        // Metadata first: an exempt range never lifts these.
        {"169.254.169.254/32", "metadata"}, {"fd00:ec2::254/128", "metadata"},
        {"0.0.0.0/8", "reserved"},         {"10.0.0.0/8", "private"},
        {"100.64.0.0/10", "cgnat"},         {"127.0.0.0/8", "loopback"},
        {"169.254.0.0/16", "link_local"},   {"172.16.0.0/12", "private"},
        {"192.0.0.0/24", "reserved"},       {"192.0.2.0/24", "documentation"},
        {"192.168.0.0/16", "private"},      {"198.18.0.0/15", "reserved"},
        {"198.51.100.0/24", "documentation"}, {"203.0.113.0/24", "documentation"},
        {"224.0.0.0/4", "multicast"},       {"240.0.0.0/4", "reserved"},
        {"::/127", "reserved"},             {"::ffff:0:0/96", "reserved"},
        {"64:ff9b:1::/48", "private"},      {"100::/64", "reserved"},
        {"2001:db8::/32", "documentation"}, {"fc00::/7", "private"},
        {"fe80::/10", "link_local"},        {"ff00::/8", "multicast"},
    };
    std::vector<BlockedRange> v;
    for (const auto& [cidr, reason] : table) v.push_back({*IpPrefix::Parse(cidr), reason});
    return v;
  }();
  return kRanges;
}

}  // namespace sbx::net
