// ProfileCatalog: the egress profiles a deployment offers (`none`, `open` and the named
// allow-lists of the configuration), and the resolution of a create's `egress_profile` and
// `egress` into what the sandbox may reach. The service (create, GET /v1/egress-profiles)
// and the runtime (NetworkHost's profile chains) read the same catalog.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "net/egress_rules.h"
#include "net/nft_ruleset.h"

namespace sbx::net {

// What a create asked for, checked: stored with the sandbox (a later configuration change
// never widens it).
struct ResolvedEgress {
  std::string profile = "none";
  bool networked = false;                          // false: `none`, no veth at all
  std::optional<std::vector<EgressRule>> narrowed; // the create's own allow rules
  SandboxPolicy policy() const { return {.profile = profile, .narrowed = narrowed}; }
  // {"profile": "lab", "narrowed": null | [rules]}: what the store keeps and
  // GET /v1/sandboxes/{id}/egress shows.
  nlohmann::json ToJson() const;
  static absl::StatusOr<ResolvedEgress> FromJson(const nlohmann::json& j);
};

class ProfileCatalog {
 public:
  // The configuration's profiles: {"NAME": {"description", "allow", "deny"}, ...} (empty: only
  // `none` and `open`). Errors name the profile and rule (egress.profiles.NAME.allow[i]).
  static absl::StatusOr<ProfileCatalog> FromJson(const nlohmann::json& profiles);

  // nullptr when there is no such profile.
  const EgressProfile* Find(const std::string& name) const;
  // {"egress_profiles": [{"name", "description", "rules"}, ...]}: none, open, then by name.
  nlohmann::json ToJson() const;
  // The configured allow-lists (for NetPolicyConfig::profiles).
  const std::vector<EgressProfile>& configured() const { return configured_; }
  // A create's `egress_profile` and optional `egress` (null when absent). InvalidArgument
  // naming the field: an unknown profile lists the available ones; a narrowing may not widen.
  absl::StatusOr<ResolvedEgress> Resolve(const std::string& profile,
                                         const nlohmann::json& egress) const;

 private:
  std::vector<EgressProfile> builtin_;     // none, open
  std::vector<EgressProfile> configured_;  // by name
};

}  // namespace sbx::net
