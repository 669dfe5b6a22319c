#include "net/profiles.h"

#include <algorithm>

#include <fmt/format.h>

#include "absl/status/status.h"
#include "common/status_util.h"

namespace sbx::net {

using Json = nlohmann::json;

Json ResolvedEgress::ToJson() const {
  Json rules = nullptr;
  if (narrowed.has_value()) {
    rules = Json::array();
    for (const auto& r : *narrowed) rules.push_back(r.ToJson());
  }
  return {{"profile", profile}, {"narrowed", std::move(rules)}};
}

absl::StatusOr<ResolvedEgress> ResolvedEgress::FromJson(const Json& j) {
  if (!j.is_object() || !j.contains("profile") || !j["profile"].is_string()) {
    return absl::InvalidArgumentError("stored egress: not an object with a profile");
  }
  ResolvedEgress r;
  r.profile = j["profile"].get<std::string>();
  r.networked = r.profile != "none";
  if (j.contains("narrowed") && !j["narrowed"].is_null()) {
    SBX_ASSIGN_OR_RETURN(std::vector<EgressRule> rules, ParseRules(j["narrowed"], "stored egress.narrowed"));
    r.narrowed = std::move(rules);
  }
  return r;
}

absl::StatusOr<ProfileCatalog> ProfileCatalog::FromJson(const Json& profiles) {
  ProfileCatalog c;
  c.builtin_ = {NoneProfile(), OpenProfile()};
  if (profiles.is_null()) return c;
  if (!profiles.is_object()) {
    return absl::InvalidArgumentError("egress.profiles: a table of profiles by name");
  }
  for (const auto& [name, body] : profiles.items()) {
    SBX_ASSIGN_OR_RETURN(EgressProfile p, ParseProfile(name, body));
    if (p.allow.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "egress.profiles.{}.allow: empty: the profile would reach nothing (use `none`)", name));
    }
    c.configured_.push_back(std::move(p));
  }
  std::sort(c.configured_.begin(), c.configured_.end(),
            [](const EgressProfile& a, const EgressProfile& b) { return a.name < b.name; });
  return c;
}

const EgressProfile* ProfileCatalog::Find(const std::string& name) const {
  for (const auto* list : {&builtin_, &configured_}) {
    for (const auto& p : *list) {
      if (p.name == name) return &p;
    }
  }
  return nullptr;
}

Json ProfileCatalog::ToJson() const {
  Json list = Json::array();
  for (const auto* l : {&builtin_, &configured_}) {
    for (const auto& p : *l) list.push_back(p.ToJson());
  }
  return {{"egress_profiles", std::move(list)}};
}

absl::StatusOr<ResolvedEgress> ProfileCatalog::Resolve(const std::string& profile,
                                                       const Json& egress) const {
  const EgressProfile* p = Find(profile);
  if (p == nullptr) {
    std::vector<std::string> names;
    for (const auto* l : {&builtin_, &configured_}) {
      for (const auto& q : *l) names.push_back(q.name);
    }
    return absl::InvalidArgumentError(
        fmt::format("egress_profile: unknown profile '{}' (available: {})", profile.substr(0, 63),
                    fmt::join(names, ", ")));
  }
  ResolvedEgress r{.profile = p->name, .networked = p->networked};
  if (!egress.is_null()) {
    SBX_ASSIGN_OR_RETURN(std::vector<EgressRule> rules, ParseNarrowing(*p, egress));
    r.narrowed = std::move(rules);
  }
  return r;
}

}  // namespace sbx::net
