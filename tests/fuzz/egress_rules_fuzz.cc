// Fuzz target for the egress rule parser (src/net/egress_rules.h): rules come from clients at
// create and from the configuration. Properties: never crashes or throws; an accepted rule
// prints back (ToJson) to JSON that parses to the same rule; a rule always lies within itself
// and within an `open` rule of its family when it has no ports, and every accepted narrowing of
// `open` lies within it; an accepted CIDR never has host bits past its prefix; the nftables text
// made from accepted rules holds only characters of addresses, numbers and keywords.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "net/egress_rules.h"
#include "net/nft_ruleset.h"
#include "net/profiles.h"

extern const char* const kFuzzSeeds[] = {
    R"({"cidr":"198.18.0.0/15","ports":"8000-8100","protocol":"tcp"})",
    R"({"cidr":"::/0"})",
    R"({"cidr":"2001:db8::1","ports":443,"protocol":"udp"})",
    R"({"domain":"pypi.org"})",
    R"({"cidr":"10.0.0.1/8"})",
    R"({"cidr":"1.2.3.4/33","ports":"0"})",
    R"([{"cidr":"0.0.0.0/0","protocol":"any"},{"cidr":"fe80::/10","ports":"1-65535"}])",
    R"({"allow":[{"cidr":"203.0.113.7","ports":"53","protocol":"udp"}]})",
    R"({"cidr":"::ffff:1.2.3.4/128","ports":"65535-1"})",
    R"({"lab":{"description":"x","allow":[{"cidr":"198.18.0.0/15","ports":"80"}],"deny":[]}})",
    R"({"profile":"open","narrowed":[{"cidr":"1.1.1.1","protocol":"udp"}]})",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}

void CheckRule(const sbx::net::EgressRule& r) {
  Check(r.WithinRule(r));
  Check(r.port_lo <= r.port_hi);
  Check(r.any_port() || r.port_lo >= 1);
  nlohmann::json back = r.ToJson();
  auto again = sbx::net::ParseRule(back, "x");
  Check(again.ok());
  Check(again->dest == r.dest && again->port_lo == r.port_lo && again->port_hi == r.port_hi &&
        again->protocol == r.protocol);
  if (r.any_port() && r.protocol == sbx::net::Protocol::kAny) {
    for (const auto& open : sbx::net::OpenProfile().allow) {
      if (open.dest.family == r.dest.family) Check(r.WithinRule(open));
    }
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  if (auto r = sbx::net::ParseRule(j, "rule"); r.ok()) CheckRule(*r);
  if (auto rules = sbx::net::ParseRules(j, "rules"); rules.ok()) {
    for (const auto& r : *rules) CheckRule(r);
    sbx::net::SandboxPolicy pol{.profile = "open", .narrowed = *rules};
    auto pool = sbx::net::AddrPool::Make(*sbx::net::IpPrefix::Parse("10.200.0.0/16"),
                                         *sbx::net::IpPrefix::Parse("fd00:5b::/64"));
    Check(pool.ok());
    std::string text = sbx::net::AddSandboxRuleset(
        "sbx_fuzz", "sbxv0", pool->AddrsOf(0),
        {.pool4 = pool->v4(), .pool6 = pool->v6()}, pol);
    for (char c : text) {
      Check(c == '\n' || c == ' ' || c == '"' || c == '_' || c == '.' || c == ':' || c == '/' ||
            c == '-' || c == '!' || c == '=' || c == '{' || c == '}' || c == ',' || c == '@' ||
            (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'));
    }
  }
  if (auto n = sbx::net::ParseNarrowing(sbx::net::OpenProfile(), j); n.ok()) {
    for (const auto& r : *n) {
      bool within = false;
      for (const auto& open : sbx::net::OpenProfile().allow) within = within || r.WithinRule(open);
      Check(within);
    }
  }
  // The configuration's profile table and a stored egress record: errors or round trips.
  if (auto cat = sbx::net::ProfileCatalog::FromJson(j); cat.ok()) {
    for (const auto& p : cat->configured()) Check(!p.allow.empty() && cat->Find(p.name) == &p);
    Check(cat->ToJson()["egress_profiles"].size() == cat->configured().size() + 2);
  }
  if (auto stored = sbx::net::ResolvedEgress::FromJson(j); stored.ok()) {
    auto again = sbx::net::ResolvedEgress::FromJson(stored->ToJson());
    Check(again.ok() && again->ToJson() == stored->ToJson());
  }
  return 0;
}
