// The service's egress part: resolving a create's profile against the deployment's catalog,
// the profiles offered and one sandbox's rules and denials. The network itself is built by the
// runtime (runtime/ns/ns_network.cc) from what the sandbox stores.
#include <fmt/format.h>

#include "common/status_util.h"
#include "common/time_util.h"
#include "net/nft_ruleset.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"
#include "service/service_internal.h"
#include "service/tenancy.h"

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

absl::StatusOr<Json> SandboxService::EgressProfiles(const Caller& caller) const {
  if (!opts_.egress_catalog) return Json{{"egress_profiles", Json::array({net::NoneProfile().ToJson()})}};
  Json all = opts_.egress_catalog->ToJson();
  std::optional<std::set<std::string>> allowed;
  SBX_RETURN_IF_ERROR(store_.Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(allowed, AllowedEgressProfiles(tx, caller.tenant_id));
    return absl::OkStatus();
  }));
  if (!allowed || !all.contains("egress_profiles")) return all;
  Json kept = Json::array();
  for (const Json& p : all["egress_profiles"]) {
    if (p.is_object() && allowed->count(p.value("name", ""))) kept.push_back(p);
  }
  all["egress_profiles"] = std::move(kept);
  return all;
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
  if (sb.egress.is_null() && sb.state != "deleted") {
    // A `none` sandbox has no network on the host to count on: its own namespace counts the
    // sends the kernel refused for want of a route (the same reading as the metric's).
    denied[net::kReasonNoRoute] = 0;
    std::lock_guard lock(mu_);
    if (auto it = instances_.find(sb.id); it != instances_.end()) {
      if (auto counts = it->second->DeniedEgress(); counts.ok()) {
        for (const auto& [reason, n] : *counts) denied[reason] = n;
      }
    }
  }
  out["denied"] = std::move(denied);
  // What was refused lately and why (newest last): so a user can see why `pip install` failed.
  Json recent = Json::array();
  if (!sb.egress.is_null() && opts_.egress_recent_denials && sb.state != "deleted") {
    for (const net::Denial& d : opts_.egress_recent_denials(sb.id)) recent.push_back(net::DenialToJson(d));
  }
  out["recent_denials"] = std::move(recent);
  return out;
}

absl::StatusOr<Json> SandboxService::PatchSandboxEgress(const Caller& caller,
                                                        const std::string& id, const Json& body) {
  SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, GetSandbox(caller, id));
  if (sb.egress.is_null() || sb.egress_profile == "none") {
    return FieldError("allow", fmt::format("sandbox {} has egress profile `none` (loopback only): "
                                           "it has no network whose rules could change",
                                           id));
  }
  const net::EgressProfile* profile =
      opts_.egress_catalog ? opts_.egress_catalog->Find(sb.egress_profile) : nullptr;
  if (profile == nullptr || !opts_.egress_patch) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "egress_unavailable",
                    fmt::format("sandbox {}: its egress profile '{}' is not offered by this sbxd "
                                "(egress.enabled, egress.profiles): its rules cannot be checked",
                                id, sb.egress_profile));
  }
  // The same check as a create's narrowing: each rule within one of the profile's.
  auto allow = net::ParseNarrowing(*profile, body);
  if (!allow.ok()) {
    std::string msg(allow.status().message());
    // "egress.allow[2]: ..." -> field "allow[2]": the PATCH body is the `egress` object.
    const size_t colon = msg.find(": ");
    std::string field = msg.substr(0, colon);
    if (field.rfind("egress.", 0) == 0) field = field.substr(7);
    else if (field == "egress") field = "allow";
    // FieldError names the field itself: "allow[0].ports: port 70000 is out of range ...".
    return FieldError(field, colon == std::string::npos ? msg : msg.substr(colon + 2));
  }
  if (sb.state != kRunning) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "invalid_state",
                    fmt::format("sandbox {} is {}: egress rules change only while it is running",
                                id, sb.state));
  }
  if (sb.current_operation_id) {
    return WithDetail(ApiError(absl::StatusCode::kFailedPrecondition, "operation_in_progress",
                               fmt::format("sandbox {}: an operation is in flight", id)),
                      "operation_id", *sb.current_operation_id);
  }
  std::lock_guard lock(egress_patch_mu_);
  net::ResolvedEgress next{.profile = sb.egress_profile, .networked = true, .narrowed = *allow};
  auto cut = opts_.egress_patch(sb.id, sb.egress_profile, *allow);
  if (!cut.ok()) {
    if (absl::IsNotFound(cut.status())) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "invalid_state",
                      fmt::format("sandbox {} has no network on this host now (it is being "
                                  "deleted or was never started here)",
                                  id));
    }
    return cut.status();
  }
  absl::Status st = store_.Transact([&](store::Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(store::SandboxRecord cur, tx.GetSandbox(sb.id));
    cur.egress = next.ToJson();
    cur.updated_at = NowRfc3339();
    return tx.PutSandbox(cur);
  });
  if (!st.ok()) {
    // The kernel has the new rules, the store the old: put the old ones back so a restart
    // and this sbxd agree. The flows already cut stay cut.
    auto old = net::ResolvedEgress::FromJson(sb.egress);
    if (old.ok()) {
      std::vector<net::EgressRule> before = old->narrowed.value_or(profile->allow);
      (void)opts_.egress_patch(sb.id, sb.egress_profile, before);
    }
    return Annotate(st, fmt::format("sandbox {}: store its new egress rules", id));
  }
  SBX_ASSIGN_OR_RETURN(Json out, SandboxEgress(caller, id));
  out["connections_cut"] = *cut;
  return out;
}

}  // namespace sbx::service
