// Port exposure (api/port_routes.cc): who may reach a sandbox's ports, and the way in.
#include <fmt/format.h>

#include "common/digest.h"
#include "common/ids.h"
#include "common/status_util.h"
#include "service/sandbox_service.h"
#include "service/service_internal.h"

namespace sbx::service {
namespace internal {

nlohmann::json NewPortAccess(bool public_ports) {
  // A secret of its own, not derived from the attach key: rotating that key must not cut the
  // URLs handed out, and a leaked traffic token opens this sandbox's ports and nothing else.
  return {{"traffic_token", "stt1." + NewSecret(32)}, {"public", public_ports}};
}

}  // namespace internal

using namespace internal;  // this folder's helpers (service_internal.h)

absl::StatusOr<std::string> SandboxService::AuthorizePort(const std::string& sandbox_id,
                                                          const PortCredentials& creds) {
  if (!IsValidId(sandbox_id, "sbx")) return BadId("sandbox", sandbox_id);
  // A running sandbox's access as cached (every request of a busy port); else from its record.
  std::optional<PortAccess> access;
  {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sandbox_id);
    if (it != instances_.end() && !frozen_.count(sandbox_id) && it->second->Alive()) {
      if (auto a = port_access_.find(sandbox_id); a != port_access_.end()) access = a->second;
    }
  }
  std::string state;  // of the record, when read
  if (!access) {
    SandboxRecord sb;
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
      auto r = tx.GetSandbox(sandbox_id);
      if (!r.ok() || r->state == kDeleted) return NotFound("sandbox", sandbox_id);
      sb = std::move(*r);
      return absl::OkStatus();
    }));
    access.emplace();
    access->tenant_id = sb.tenant_id;
    access->is_public = sb.port_access.is_object() && sb.port_access.value("public", false);
    const std::string token =
        sb.port_access.is_object() ? sb.port_access.value("traffic_token", std::string()) : "";
    if (!token.empty()) access->token_sha256 = Sha256Hex(token);
    state = sb.state;
  }
  bool allowed = access->is_public;
  if (creds.caller) {
    // Another tenant's sandbox is indistinguishable from a missing one, as everywhere else.
    if (creds.caller->tenant_id != access->tenant_id) return NotFound("sandbox", sandbox_id);
    allowed = true;
  } else if (creds.traffic_token) {
    // Hashed first: the compare takes as long whatever the lengths (common/digest.h).
    const bool match = !access->token_sha256.empty() &&
                       ConstantTimeEquals(Sha256Hex(*creds.traffic_token), access->token_sha256);
    if (!match && !access->is_public) {
      return ApiError(absl::StatusCode::kPermissionDenied, "permission_denied",
                      fmt::format("the traffic token is not the one of sandbox {}", sandbox_id));
    }
    allowed = true;
  }
  if (!allowed) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    fmt::format("sandbox {}'s ports need its traffic token (X-Sbx-Traffic-Token) "
                                "or a management token (Authorization: Bearer)", sandbox_id));
  }
  if (!state.empty()) {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sandbox_id);
    if (it == instances_.end() || frozen_.count(sandbox_id) || !it->second->Alive()) {
      if (state == kRunning) state = "being paused";
      return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                      fmt::format("sandbox {} is {}, not running", sandbox_id, state));
    }
    port_access_[sandbox_id] = *access;
  }
  // Traffic to a sandbox's server is use of the sandbox: it keeps it from idling.
  activity_.Touch(sandbox_id);
  return access->tenant_id;
}

runtime::InstancePtr SandboxService::EraseInstanceLocked(const std::string& id) {
  port_access_.erase(id);
  auto it = instances_.find(id);
  if (it == instances_.end()) return nullptr;
  runtime::InstancePtr out = std::move(it->second);
  instances_.erase(it);
  return out;
}

absl::StatusOr<UniqueFd> SandboxService::DialPort(const std::string& sandbox_id, uint16_t port,
                                                  bool ipv6) const {
  std::lock_guard lock(mu_);
  auto it = instances_.find(sandbox_id);
  if (it == instances_.end() || frozen_.count(sandbox_id) || !it->second->Alive()) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is not running", sandbox_id));
  }
  return it->second->DialPort(port, ipv6);
}

}  // namespace sbx::service
