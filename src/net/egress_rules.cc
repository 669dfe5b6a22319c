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

namespace {

// The ports and protocol part of WithinRule.
bool PortsWithin(const EgressRule& r, const EgressRule& wider) {
  if (wider.protocol != Protocol::kAny && wider.protocol != r.protocol) return false;
  if (wider.any_port()) return true;
  // A port-limited rule covers no protocol without ports (ICMP), so "any" cannot fit in it.
  if (r.any_port() || (r.protocol == Protocol::kAny && wider.protocol != Protocol::kAny)) return false;
  return r.port_lo >= wider.port_lo && r.port_hi <= wider.port_hi;
}

// `*.x` covers `*.y.x` and `y.x`; a plain name covers only itself.
bool PatternWithin(std::string_view narrow, std::string_view wide) {
  if (narrow == wide) return true;
  if (!wide.starts_with("*.")) return false;
  std::string_view suffix = wide.substr(1);  // ".x"
  std::string_view n = narrow.starts_with("*.") ? narrow.substr(2) : narrow;
  return n.size() > suffix.size() && n.ends_with(suffix);
}

}  // namespace

bool EgressRule::WithinRule(const EgressRule& wider) const {
  if (is_domain()) {
    // A name may resolve to any address, so only a rule of every address holds a domain rule.
    if (!wider.is_domain() && !wider.AllAddresses()) return false;
    if (wider.is_domain() && !PatternWithin(domain, wider.domain)) return false;
    return PortsWithin(*this, wider);
  }
  if (wider.is_domain()) return false;
  if (!wider.dest.Contains(dest)) return false;
  return PortsWithin(*this, wider);
}

bool EgressRule::MatchesName(std::string_view name) const {
  if (!is_domain()) return false;
  if (!domain.starts_with("*.")) return name == domain;
  std::string_view suffix = std::string_view(domain).substr(1);
  return name.size() > suffix.size() && name.ends_with(suffix);
}

bool EgressRule::Matches(std::string_view name, uint16_t port) const {
  if (!MatchesName(name)) return false;
  return port == 0 || any_port() || (port >= port_lo && port <= port_hi);
}

bool HasDomainRules(const std::vector<EgressRule>& rules) {
  for (const auto& r : rules) {
    if (r.is_domain()) return true;
  }
  return false;
}

bool NameAllowed(const std::vector<EgressRule>& allow, const std::vector<EgressRule>& deny,
                 std::string_view name, uint16_t port) {
  for (const auto& d : deny) {
    if (d.MatchesName(name) && (port == 0 ? d.any_port() : d.Matches(name, port))) return false;
  }
  for (const auto& a : allow) {
    if (a.Matches(name, port)) return true;
    if (a.AllAddresses() && (port == 0 || a.any_port() || (port >= a.port_lo && port <= a.port_hi))) {
      return true;
    }
  }
  return false;
}

std::string NormalizeName(std::string_view name) {
  if (name.ends_with('.')) name.remove_suffix(1);
  if (name.empty() || name.size() > 253) return {};
  std::string out;
  out.reserve(name.size());
  size_t label = 0;
  bool all_digits = true;
  for (char c : name) {
    char l = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if (l == '.') {
      if (label == 0) return {};
      label = 0;
    } else if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-' || l == '_') {
      if (++label > 63) return {};
      if (!(l >= '0' && l <= '9')) all_digits = false;
    } else {
      return {};
    }
    out.push_back(l);
  }
  if (label == 0) return {};
  // "1.2.3.4" is an address, not a name: a rule for it is a CIDR rule.
  if (all_digits) return {};
  return out;
}

Json EgressRule::ToJson() const {
  Json j = {{"protocol", std::string(ProtocolName(protocol))}};
  if (is_domain()) j["domain"] = domain;
  else j["cidr"] = dest.ToString();
  if (!any_port()) {
    j["ports"] = port_lo == port_hi ? fmt::format("{}", port_lo)
                                    : fmt::format("{}-{}", port_lo, port_hi);
  }
  return j;
}

absl::StatusOr<EgressRule> ParseRule(const Json& j, std::string_view field) {
  if (!j.is_object()) return Bad(field, "a rule is an object such as {\"cidr\": \"203.0.113.0/24\"}");
  for (const auto& [key, value] : j.items()) {
    if (key != "cidr" && key != "domain" && key != "ports" && key != "protocol") {
      return Bad(field,
                 fmt::format("unknown key '{}' (a rule has cidr or domain, ports, protocol)", key));
    }
  }
  // null is a key left out (the API's convention; a TOML file has no null).
  auto given = [&j](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (given("cidr") == given("domain")) {
    return Bad(field, "a rule has exactly one of \"cidr\" (\"203.0.113.0/24\") and \"domain\" "
                      "(\"pypi.org\", \"*.pythonhosted.org\")");
  }
  EgressRule r;
  if (given("domain")) {
    std::string df = fmt::format("{}.domain", field);
    if (!j["domain"].is_string()) return Bad(df, "a string such as \"pypi.org\"");
    std::string_view text = j["domain"].get_ref<const std::string&>();
    bool wildcard = text.starts_with("*.");
    std::string name = NormalizeName(wildcard ? text.substr(2) : text);
    if (name.empty() || text.find('*', wildcard ? 1 : 0) != std::string_view::npos) {
      return Bad(df, fmt::format("'{}' is not a host name or '*.' and a host name (a bare "
                                 "address belongs in \"cidr\")",
                                 text.substr(0, 64)));
    }
    r.domain = wildcard ? "*." + name : name;
    r.protocol = Protocol::kTcp;
  } else {
    if (!j["cidr"].is_string()) {
      return Bad(field, "\"cidr\" (a string such as \"203.0.113.0/24\") is required");
    }
    std::string cidr_field = fmt::format("{}.cidr", field);
    auto prefix = IpPrefix::Parse(j["cidr"].get_ref<const std::string&>());
    if (!prefix.ok()) return Bad(cidr_field, std::string(prefix.status().message()));
    r.dest = *prefix;
  }
  if (given("protocol")) {
    const Json& p = j["protocol"];
    std::string pf = fmt::format("{}.protocol", field);
    if (!p.is_string()) return Bad(pf, "a string: tcp, udp or any");
    const std::string& s = p.get_ref<const std::string&>();
    if (s == "tcp") r.protocol = Protocol::kTcp;
    else if (s == "udp") r.protocol = Protocol::kUdp;
    else if (s == "any") r.protocol = Protocol::kAny;
    else return Bad(pf, fmt::format("'{}' is not tcp, udp or any", s.substr(0, 16)));
    if (r.is_domain() && r.protocol != Protocol::kTcp) {
      return Bad(pf, "a domain rule is tcp only: QUIC and other UDP carry no name sbx can check "
                     "before the first packet leaves");
    }
  }
  if (given("ports")) {
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
