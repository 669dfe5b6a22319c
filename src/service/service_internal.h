// Helpers shared by the files that implement SandboxService (sandbox_service.cc, create.cc,
// lifecycle.cc, sessions.cc, reconcile.cc, resources.cc). Not for use outside src/service.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/log.h"
#include "runtime/backend.h"
#include "service/admission.h"
#include "service/inputs.h"
#include "service/sandbox_service.h"
#include "store/store.h"

namespace sbx::service::internal {

// The names the service's files use (they say `using namespace internal`).
using nlohmann::json;
using store::OperationRecord;
using store::SandboxRecord;
using store::SessionRecord;
using store::Tx;

absl::Status BadId(std::string_view kind, const std::string& id);
// A new sandbox's SandboxRecord::port_access (ports.cc): a fresh traffic token, and whether its
// ports are open without one.
nlohmann::json NewPortAccess(bool public_ports, const std::string& sandbox_id);
// A new envd access token (api/e2b): "set1.<sandbox id>.<32 random bytes>". It names its
// sandbox because an SDK may send it without E2b-Sandbox-Id (Python e2b 2.21.1 after
// Sandbox.connect(id)); only the secret part authenticates.
std::string NewEnvdToken(const std::string& sandbox_id);
absl::Status NotFound(std::string_view kind, const std::string& id);
// A getter's answer for a row only some callers may see: the row, or 404 (NotFound(kind, id))
// when it is missing or `visible` says it is not the caller's (the two must look the same).
// Any other failure of the read (the store unreachable, a row that does not decode, a
// serialization failure the store retries) is returned as it is: a 404 for it would tell a
// client that its sandbox is gone when the database only blinked.
template <typename Row, typename Visible>
absl::StatusOr<Row> VisibleRow(absl::StatusOr<Row> got, Visible visible, std::string_view kind,
                               const std::string& id) {
  if (!got.ok() && !absl::IsNotFound(got.status())) return got.status();
  if (!got.ok() || !visible(*got)) return NotFound(kind, id);
  return got;
}
nlohmann::json ErrorJson(std::string_view code, const absl::Status& s);

// --- Resources (resources.cc) ---

// What a new sandbox gets: what its create asked for, the rest from the deployment's defaults.
// Computed once per create; the warm pool's match, admission and the stored record derive from
// it.
runtime::Resources EffectiveOf(const CreateSandboxRequest& req, runtime::Resources defaults);
// The stored forms: `resources` as requested (omitted ones absent), and effective_resources.
nlohmann::json RequestedResources(const CreateSandboxRequest& req);
nlohmann::json EffectiveResources(const runtime::Resources& r, int64_t output_buffer_bytes);
// effective_resources read back. Sandboxes stored before a key existed get today's deployment
// default for it, both when (re)launched and when shown.
runtime::Resources ResourcesOf(const nlohmann::json& eff, const runtime::Resources& d);
Demand DemandOf(const runtime::Resources& r);
// Starts the template's start command in a fresh instance and waits for its readiness check
// (template_start.cc); OK at once for a template without one.
absl::Status StartTemplateProcess(const runtime::Instance& inst, const runtime::TemplateSpec& t);
// Whether a stored sandbox holds host resources (admission.h): everything that may still have
// processes or a disk, frozen ones included. A failed sandbox holds nothing, except one whose
// destroy failed: its processes may still run.
bool HoldsResources(const store::SandboxRecord& sb);
void FillEffectiveDefaults(store::SandboxRecord& sb, const runtime::Resources& defaults,
                           int64_t output_buffer_bytes);

// --- Idempotency and operations (service_internal.cc) ---

// The stored answer for `idem`'s key (a replay), nullopt for a new key; a key used with
// another body is idempotency_key_reused.
absl::StatusOr<std::optional<Rendered>> CheckIdempotency(store::Tx& tx, const Caller& caller,
                                                         const std::optional<Idempotency>& idem,
                                                         const std::string& body_hash);
absl::Status SaveIdempotency(store::Tx& tx, const Caller& caller,
                             const std::optional<Idempotency>& idem, const std::string& body_hash,
                             const Result& result);

store::OperationRecord NewOperation(const std::string& tenant, const std::string& kind,
                                    const std::string& sandbox_id, const std::string& now);
void Finish(store::OperationRecord& op, bool ok, nlohmann::json error, const std::string& now);
// How a finished operation is logged: "succeeded", "cancelled" or "failed".
std::string_view ResultOf(const store::OperationRecord& op);
// "store: <message>" for a failed store step, "" for OK.
std::string StoreError(const absl::Status& s);

// The log context of an operation's job: the request that asked for it (its request_id comes
// from the caller's scope, see api.cc) plus the operation, its sandbox and tenant.
log::Context OperationLog(const std::string& op_id, const std::string& sandbox_id,
                          const std::string& tenant);
// One line per committed state change of a sandbox ("" is a sandbox that did not exist).
void LogStateChange(const std::string& sandbox_id, std::string_view from, std::string_view to,
                    std::string_view why = {});

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t);

// "operation <kind> started" and "operation <kind> <result> in N ms": the two lines an operator
// looks for when a sandbox seems stuck. Logged on the engine's worker, whose scope supplies the
// operation, sandbox and tenant fields.
void LogOperationStarted(std::string_view kind);
void LogOperationFinished(std::string_view kind, std::string_view result, Clock::time_point started,
                          double runtime_ms = -1, std::string_view error = {});

}  // namespace sbx::service::internal
