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
  // Recorded on the operations this caller starts: "api" for clients, "ttl" and "idle" for the
  // server's own timers (whose calls do not count as activity on the sandbox).
  std::string initiator = "api";
};

}  // namespace sbx::service
