// The service's egress part: resolving a create's profile against the deployment's catalog,
// the profiles offered and one sandbox's rules and denials. The network itself is built by the
// runtime (runtime/ns/ns_network.cc) from what the sandbox stores.
#include <fmt/format.h>

#include "common/status_util.h"
#include "service/sandbox_service.h"
#include "service/service_internal.h"

namespace sbx::service {

using Json = nlohmann::json;

absl::StatusOr<Json> SandboxService::ResolveEgress(const CreateSandboxRequest& req) const {
  if (!opts_.egress_catalog) {
    // Networking off: the catalog of a deployment without it is `none` alone.
    if (req.egress_profile != "none") {
      return FieldError("egress_profile",
                        fmt::format("egress_profile: unknown profile '{}' (available: none; "
                                    "this deployment has networking off, egress.enabled)",
                                    req.egress_profile));
    }
    if (!req.egress.is_null()) {
      return FieldError("egress", "egress: profile `none` reaches nothing and cannot be narrowed");
    }
    return Json(nullptr);
  }
  auto resolved = opts_.egress_catalog->Resolve(req.egress_profile, req.egress);
  if (!resolved.ok()) {
    const std::string msg(resolved.status().message());
    return FieldError(msg.rfind("egress_profile", 0) == 0 ? "egress_profile" : "egress", msg);
  }
  if (!resolved->networked) return Json(nullptr);
  return resolved->ToJson();
}

Json SandboxService::EgressProfiles() const {
  if (opts_.egress_catalog) return opts_.egress_catalog->ToJson();
  return {{"egress_profiles", Json::array({net::NoneProfile().ToJson()})}};
}

absl::StatusOr<Json> SandboxService::SandboxEgress(const Caller& caller, const std::string& id) {
  SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, GetSandbox(caller, id));
  Json out = {{"sandbox_id", sb.id}, {"profile", sb.egress_profile}, {"narrowed", nullptr}};
  const net::EgressProfile* profile =
      opts_.egress_catalog ? opts_.egress_catalog->Find(sb.egress_profile) : nullptr;
  net::EgressProfile none = net::NoneProfile();
  if (sb.egress_profile == "none") profile = &none;
  Json rules = Json::array();
  if (sb.egress.is_object() && sb.egress.contains("narrowed") && !sb.egress["narrowed"].is_null()) {
    // A narrowed sandbox has its own allow rules, the profile's deny rules still apply.
    out["narrowed"] = sb.egress["narrowed"];
    if (profile != nullptr) {
      for (const auto& r : profile->deny) {
        Json j = r.ToJson();
        j["action"] = "deny";
        rules.push_back(std::move(j));
      }
    }
    for (const auto& r : sb.egress["narrowed"]) {
      Json j = r;
      j["action"] = "allow";
      rules.push_back(std::move(j));
    }
  } else if (profile != nullptr) {
    rules = profile->ToJson().value("rules", Json::array());
  }
  out["rules"] = std::move(rules);
  Json denied = Json::object();
  for (const auto& reason : net::DenialReasons()) denied[reason] = 0;
  if (!sb.egress.is_null() && opts_.egress_denials && sb.state != "deleted") {
    auto counts = opts_.egress_denials(sb.id);
    if (counts.ok()) {
      for (const auto& [reason, n] : *counts) denied[reason] = n;
    } else if (!absl::IsNotFound(counts.status())) {
      return counts.status();
    }
  }
  out["denied"] = std::move(denied);
  return out;
}

}  // namespace sbx::service
