// Port exposure (api/port_routes.cc): who may reach a sandbox's ports, and the way in.
#include <fmt/format.h>

#include "common/digest.h"
#include "common/ids.h"
#include "common/status_util.h"
#include "service/mgmt_token.h"
#include "service/sandbox_service.h"
#include "service/service_internal.h"

namespace sbx::service {
namespace internal {

nlohmann::json NewPortAccess(bool public_ports, const std::string& sandbox_id) {
  // A secret of its own, not derived from the attach key: rotating that key must not cut the
  // URLs handed out, and a leaked traffic token opens this sandbox's ports and nothing else.
  // The envd token (api/e2b): E2B's per-sandbox access token for its processes and files.
  // A secret of its own too: it opens one sandbox's data plane, never its management.
  return {{"traffic_token", "stt1." + NewSecret(32)},
          {"public", public_ports},
          {"envd_token", NewEnvdToken(sandbox_id)}};
}

std::string NewEnvdToken(const std::string& sandbox_id) {
  return "set1." + sandbox_id + "." + NewSecret(32);
}

}  // namespace internal

using namespace internal;  // this folder's helpers (service_internal.h)

absl::StatusOr<SandboxService::PortAccess> SandboxService::AccessOf(
    const std::string& sandbox_id, std::string& state) {
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
  state.clear();
  if (!access) {
    SandboxRecord sb;
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
      SBX_ASSIGN_OR_RETURN(sb, VisibleRow(tx.GetSandbox(sandbox_id), [](const SandboxRecord& r) {
                             return r.state != kDeleted;
                           }, "sandbox", sandbox_id));
      return absl::OkStatus();
    }));
    access.emplace();
    access->tenant_id = sb.tenant_id;
    access->is_public = sb.port_access.is_object() && sb.port_access.value("public", false);
    const std::string token =
        sb.port_access.is_object() ? sb.port_access.value("traffic_token", std::string()) : "";
    if (!token.empty()) access->token_sha256 = Sha256Hex(token);
    const std::string envd =
        sb.port_access.is_object() ? sb.port_access.value("envd_token", std::string()) : "";
    if (!envd.empty()) access->envd_sha256 = Sha256Hex(envd);
    state = sb.state;
  }
  return *access;
}

// Caches what a running sandbox's record said, and checks it is running (the record's state is
// `state`; empty when `access` came from the cache).
absl::Status SandboxService::CheckRunningAndCache(const std::string& sandbox_id,
                                                  const PortAccess& access, std::string state) {
  if (state.empty()) return absl::OkStatus();
  std::lock_guard lock(mu_);
  auto it = instances_.find(sandbox_id);
  if (it == instances_.end() || frozen_.count(sandbox_id) || !it->second->Alive()) {
    if (state == kRunning) state = "being paused";
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is {}, not running", sandbox_id, state));
  }
  port_access_[sandbox_id] = access;
  return absl::OkStatus();
}

absl::StatusOr<std::string> SandboxService::AuthorizePort(const std::string& sandbox_id,
                                                          const PortCredentials& creds) {
  std::string state;  // of the record, when read
  SBX_ASSIGN_OR_RETURN(PortAccess found, AccessOf(sandbox_id, state));
  const PortAccess* access = &found;
  bool allowed = access->is_public;
  if (creds.envd_token && !access->envd_sha256.empty() &&
      ConstantTimeEquals(Sha256Hex(*creds.envd_token), access->envd_sha256)) {
    allowed = true;
  } else if (creds.caller) {
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
  SBX_RETURN_IF_ERROR(CheckRunningAndCache(sandbox_id, *access, state));
  // Traffic to a sandbox's server is use of the sandbox: it keeps it from idling.
  activity_.Touch(sandbox_id);
  return access->tenant_id;
}

absl::StatusOr<Caller> SandboxService::AuthorizeEnvd(const std::string& sandbox_id,
                                                     const std::optional<std::string>& token) {
  std::string state;
  SBX_ASSIGN_OR_RETURN(PortAccess access, AccessOf(sandbox_id, state));
  if (!token || token->empty()) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    fmt::format("sandbox {}'s envd needs its access token (X-Access-Token)",
                                sandbox_id));
  }
  // Hashed first: the compare takes as long whatever the lengths (common/digest.h).
  if (access.envd_sha256.empty() ||
      !ConstantTimeEquals(Sha256Hex(*token), access.envd_sha256)) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    fmt::format("the access token is not the one of sandbox {}", sandbox_id));
  }
  SBX_RETURN_IF_ERROR(CheckRunningAndCache(sandbox_id, access, state));
  activity_.Touch(sandbox_id);
  Caller owner{access.tenant_id, std::nullopt};
  owner.token_id = "envd:" + sandbox_id;
  owner.scopes = static_cast<uint32_t>(Scope::kSessions) | static_cast<uint32_t>(Scope::kFiles) |
                 static_cast<uint32_t>(Scope::kRead);
  return owner;
}

absl::StatusOr<std::string> SandboxService::EnvdToken(const Caller& caller,
                                                      const std::string& sandbox_id) {
  std::string token;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, VisibleSandbox(tx, caller, sandbox_id));
    if (sb.state == kDeleted || sb.state == kDeleting) return NotFound("sandbox", sandbox_id);
    if (!sb.port_access.is_object()) sb.port_access = NewPortAccess(false, sb.id);
    token = sb.port_access.value("envd_token", std::string());
    if (!token.empty()) return absl::OkStatus();
    // A sandbox made before envd tokens existed gets one now, kept with its record.
    token = NewEnvdToken(sb.id);
    sb.port_access["envd_token"] = token;
    return tx.PutSandbox(sb);
  }));
  std::lock_guard lock(mu_);
  port_access_.erase(sandbox_id);  // re-read with the token on the next request
  return token;
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
