// Start-up: what the store says against what the runtimes hold (SandboxService::Reconcile).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>
#include <set>

#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"
#include "service/service_internal.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

absl::Status SandboxService::Reconcile() {
  std::vector<SandboxRecord> live;
  std::vector<OperationRecord> unfinished;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(live, tx.ListLiveSandboxes());
    SBX_ASSIGN_OR_RETURN(unfinished, tx.ListUnfinishedOperations());
    return absl::OkStatus();
  }));

  std::map<std::string, std::set<std::string>> known;  // runtime -> ids it may keep
  struct Redrive {
    std::string op_id, sandbox_id, tenant;
  };
  std::vector<Redrive> redrive_deletes;
  std::vector<std::string> adopted;
  for (SandboxRecord& sb : live) {
    // What the runtime logs while adopting names the sandbox.
    log::Context lctx;
    lctx.sandbox = sb.id;
    lctx.tenant = sb.tenant_id;
    log::Scope scope(lctx);
    known[sb.runtime].insert(sb.id);
    switch (OnRestartOf(sb.state)) {
      case OnRestart::kAdopt: {
        SBX_ASSIGN_OR_RETURN(bool kept, AdoptOnRestart(sb, unfinished));
        if (kept) {
          adopted.push_back(sb.id);
          continue;
        }
        break;  // lost: failed below, with the error AdoptOnRestart gave it
      }
      case OnRestart::kFail:
        sb.error = {{"code", "create_failed"},
                    {"message", "sbxd restarted while the sandbox was being created"}};
        break;
      case OnRestart::kRedriveDelete:
        if (sb.current_operation_id) {
          redrive_deletes.push_back(Redrive{*sb.current_operation_id, sb.id, sb.tenant_id});
        }
        continue;
      case OnRestart::kKeep:
        continue;  // failed sandboxes stay as they are until deleted
    }
    const std::string from = sb.state;
    sb.state = std::string(kFailed);
    sb.current_operation_id.reset();
    sb.updated_at = NowRfc3339();
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) { return tx.PutSandbox(sb); }));
    LogStateChange(sb.id, from, kFailed, sb.error.value("message", ""));
  }

  std::set<std::string> redriven;
  for (const auto& r : redrive_deletes) redriven.insert(r.op_id);
  SBX_RETURN_IF_ERROR(FailInterrupted(unfinished, redriven));
  RestoreActiveSessions(adopted);
  RestoreLedger(live);

  for (const auto& [name, backend] : backends_) {
    absl::Status st = backend->Sweep(known[name]);
    if (!st.ok()) {
      spdlog::warn("sweep of runtime {}: {}", name, std::string(st.message()));
    }
  }
  for (const auto& r : redrive_deletes) {
    std::string op = r.op_id, id = r.sandbox_id;
    const TimePoint requested = ServiceMetrics::Clock::now();
    SubmitJob(op, id, [this, op, id, requested] { RunDelete(op, id, requested); },
              OperationLog(op, id, r.tenant));
  }
  {
    std::lock_guard lock(mu_);
    ready_ = true;
  }
  spdlog::info("reconciled: {} sandboxes adopted, {} deletes re-driven", instances_.size(),
               redrive_deletes.size());
  return absl::OkStatus();
}

absl::StatusOr<bool> SandboxService::AdoptOnRestart(SandboxRecord& sb,
                                                    const std::vector<OperationRecord>& unfinished) {
  auto backend = BackendFor(sb.runtime);
  if (!backend.ok()) {
    sb.error = {{"code", "sandbox_lost"},
                {"message", fmt::format("runtime {} is not available", sb.runtime)}};
    return false;
  }
  auto inst = (*backend)->Adopt(sb.id, sb.runtime_state);
  if (!inst.ok()) {
    spdlog::warn("sandbox {} could not be re-adopted: {}", sb.id,
                 std::string(inst.status().message()));
    sb.error = {{"code", "sandbox_lost"},
                {"message", fmt::format("lost across an sbxd restart: {}",
                                        std::string(inst.status().message()))}};
    return false;
  }
  // The kernel knows whether the sandbox is frozen; the store may not (a pause, suspend or wake
  // interrupted by the restart is failed in FailInterrupted).
  bool interrupted = false;
  if (sb.current_operation_id) {
    for (const auto& op : unfinished) {
      const std::optional<Verb> verb = VerbNamed(op.kind);
      if (op.id == *sb.current_operation_id && verb && *verb != Verb::kDelete) {
        interrupted = true;
      }
    }
  }
  std::string state = sb.state;
  auto frozen = (*inst)->IsFrozen();
  if (frozen.ok()) {
    state = *frozen ? (IsFrozenState(sb.state) ? sb.state : std::string(kPaused))
                    : std::string(kRunning);
  } else {
    spdlog::warn("sandbox {}: freezer state unknown, keeping '{}': {}", sb.id, sb.state,
                 std::string(frozen.status().message()));
  }
  if (state != sb.state || interrupted) {
    const std::string from = sb.state;
    sb.state = state;
    if (interrupted) sb.current_operation_id.reset();
    sb.updated_at = NowRfc3339();
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) { return tx.PutSandbox(sb); }));
    LogStateChange(sb.id, from, state, "what the kernel says after the restart");
  }
  // What it was denied before the restart was counted by the previous process.
  if (auto n = (*inst)->DeniedEgress(); n.ok()) {
    metrics_->EgressReading(sb.id, *n, /*baseline=*/true);
  }
  std::lock_guard lock(mu_);
  instances_[sb.id] = std::move(*inst);
  if (IsFrozenState(state)) frozen_.insert(sb.id);
  return true;
}

absl::Status SandboxService::FailInterrupted(std::vector<OperationRecord>& unfinished,
                                             const std::set<std::string>& redriven) {
  // Operations a crash interrupted (other than the deletes re-driven) failed.
  for (OperationRecord& op : unfinished) {
    if (redriven.count(op.id)) continue;
    const std::string now = NowRfc3339();
    Finish(op, false, {{"code", "interrupted"}, {"message", "sbxd restarted during the operation"}},
           now);
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) { return tx.PutOperation(op); }));
    log::Context lctx;
    lctx.operation = op.id;
    lctx.sandbox = op.sandbox_id;
    lctx.tenant = op.tenant_id;
    log::Scope scope(lctx);
    log::Event(spdlog::level::warn, {{"kind", op.kind}, {"result", "failed"}},
               "operation {} failed: sbxd restarted during it", op.kind);
    // When it was accepted is not known to this process: counted, no duration.
    metrics_->OperationFinished(op, std::nullopt);
  }
  return absl::OkStatus();
}

void SandboxService::RestoreActiveSessions(const std::vector<std::string>& adopted) {
  // Sessions still running in the re-adopted sandboxes are active again. Only a metric
  // depends on it, so a failure is logged, not fatal.
  std::vector<std::string> running_sessions;
  absl::Status listed = store_.Transact([&](Tx& tx) -> absl::Status {
    running_sessions.clear();
    for (const std::string& id : adopted) {
      SBX_ASSIGN_OR_RETURN(std::vector<SessionRecord> sessions, tx.ListSessions(id));
      for (const SessionRecord& s : sessions) {
        if (s.state == "running") running_sessions.push_back(s.id);
      }
    }
    return absl::OkStatus();
  });
  if (!listed.ok()) {
    spdlog::warn("sbx_sessions_active starts without the sessions of re-adopted sandboxes: {}",
                 std::string(listed.message()));
    return;
  }
  for (const std::string& id : running_sessions) {
    metrics_->SessionStarted(id, /*count_start=*/false);
  }
}

void SandboxService::RestoreLedger(const std::vector<SandboxRecord>& live) {
  // From the states just settled: what the store says each sandbox holds.
  const runtime::Resources d = defaults();
  int64_t held = 0;
  for (const SandboxRecord& sb : live) {
    if (!HoldsResources(sb)) continue;
    admission_->Hold(sb.id, DemandOf(ResourcesOf(sb.effective_resources, d)));
    ++held;
  }
  if (held > 0) spdlog::info("admission: {} sandboxes hold resources after the restart", held);
}

}  // namespace sbx::service
