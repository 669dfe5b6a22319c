// Validated inputs of the service's calls. The api/ layer parses untrusted JSON into these;
// the service trusts their shape but still checks everything that depends on state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sbx::service {

struct CreateSandboxRequest {
  std::string template_ref = "base";
  // As requested, within api's limits; the service fills the rest from the deployment's
  // defaults (runtime/resources.h).
  std::optional<int64_t> vcpu, memory_mib, disk_mib;
  std::string egress_profile = "none";
  nlohmann::json egress = nullptr;  // {"allow": [rules]} narrowing the profile, or null
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  std::optional<std::string> runtime;
  std::optional<int64_t> timeout_s;
  std::optional<int64_t> idle_suspend_s;
  // Port exposure without a token (docs/api.md, "Ports"): anyone who can reach sbxd can reach
  // the sandbox's servers.
  bool public_ports = false;
  // placement.anti_affinity: a key of `labels`. Across nodes (docs/scale.md), the sandbox goes
  // preferably where the fewest of the tenant's live sandboxes share its value; one host has
  // no choice to make.
  std::optional<std::string> anti_affinity;
  nlohmann::json canonical;  // the parsed body, for idempotency hashing
};

struct CreateSessionRequest {
  std::vector<std::string> argv;
  std::optional<std::string> cwd;
  std::map<std::string, std::string> env;
  std::optional<std::string> user;
  bool tty = false;
  std::optional<int> tty_rows, tty_cols;  // tty given as {"rows","cols"}
  bool stdin_open = false;
  std::optional<int64_t> timeout_s;
  std::optional<int64_t> kill_grace_s;  // only with timeout_s
  nlohmann::json canonical;
};

// Who is calling: a tenant (management token) or the holder of one session's attach token.
struct Caller {
  std::string tenant_id;
  std::optional<std::string> session_scope;  // set for attach tokens: the only session allowed
  // The management token ("tok_…", "bootstrap" for the configured admin token; "" for an
  // attach token and the server's own timers) and its scopes (service/mgmt_token.h bits).
  std::string token_id;
  uint32_t scopes = UINT32_MAX;
  // Recorded on the operations this caller starts: "api" for clients, "ttl" and "idle" for the
  // server's own timers (whose calls do not count as activity on the sandbox).
  std::string initiator = "api";
};

// POST /v1/admin/tenants and PATCH /v1/admin/tenants/{id} (docs/tenancy.md). The quotas and
// the rate limit are checked by the parser (known keys, non-negative integers).
struct TenantSpec {
  std::optional<std::string> name;
  std::optional<nlohmann::json> quotas;      // {"max_sandboxes": N, ...}: replaces the whole set
  std::optional<nlohmann::json> rate_limit;  // {"requests_per_s": R, "burst": B} or {}
  // ["name", ...] (the egress profiles it may use besides `none`) or null (every one).
  std::optional<nlohmann::json> egress_profiles;
};

// POST /v1/admin/tenants/{id}/tokens.
struct TokenSpec {
  std::string name;
  std::vector<std::string> scopes;
  std::optional<int64_t> expires_in_s;
};

}  // namespace sbx::service
