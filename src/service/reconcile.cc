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
#include "service/template_ref.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

absl::Status SandboxService::Reconcile() {
  std::vector<SandboxRecord> live;
  std::vector<OperationRecord> unfinished;
  int64_t claimed = 0;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    // Rows from before nodes existed are this host's when it is the only one (--role all).
    claimed = 0;
    if (opts_.claim_unassigned) {
      SBX_ASSIGN_OR_RETURN(claimed, tx.ClaimUnassigned(opts_.node_name));
    }
    // Only this node's: other nodes on the same store keep theirs (docs/scale.md).
    SBX_ASSIGN_OR_RETURN(live, tx.ListLiveSandboxes(opts_.node_name));
    SBX_ASSIGN_OR_RETURN(unfinished, tx.ListUnfinishedOperations(opts_.node_name));
    return absl::OkStatus();
  }));
  if (claimed > 0) {
    spdlog::info("reconcile: {} sandboxes from before schema 9 are node {}'s", claimed,
                 opts_.node_name);
  }

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
    // A lost sandbox is not this node's any more: what is left of it here is swept below.
    if (OnRestartOf(sb.state) == OnRestart::kRelease) continue;
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
      case OnRestart::kRelease:
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

int SandboxService::ReleaseUnowned() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, inst] : instances_) ids.push_back(id);
  }
  int released = 0;
  for (const std::string& id : ids) {
    std::optional<SandboxRecord> sb;
    absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
      sb.reset();
      auto got = tx.GetSandbox(id);
      if (absl::IsNotFound(got.status())) return absl::OkStatus();
      SBX_RETURN_IF_ERROR(got.status());
      sb = std::move(*got);
      return absl::OkStatus();
    });
    if (!st.ok()) {
      spdlog::warn("sandbox {}: kept: the store could not say whose it is: {}", id,
                   std::string(st.message()));
      continue;
    }
    if (sb && sb->node == opts_.node_name && sb->state != kLost && sb->state != kDeleted) {
      continue;
    }
    spdlog::warn("sandbox {}: no longer this node's ({}): destroying it", id,
                 sb ? fmt::format("{} on node '{}'", sb->state, sb->node) : "not in the store");
    activity_.Forget(id);
    ReleaseCapacity(id);
    DropInstance(id);
    ++released;
  }
  return released;
}

NodeReport SandboxService::Report() const {
  NodeReport r;
  const Admission::Snapshot snap = admission_->Read();
  r.capacity.vcpu = snap.capacity.vcpu;
  r.capacity.memory_mib = snap.capacity.memory_mib;
  r.capacity.disk_mib = snap.capacity.disk_mib;
  r.capacity.max_sandboxes = admission_->settings().max_sandboxes;
  const Demand d = DemandOf(defaults());
  r.capacity.default_vcpu = d.vcpu;
  r.capacity.default_memory_mib = d.memory_mib;
  r.capacity.default_disk_mib = d.disk_mib;
  for (const auto& [name, backend] : backends_) r.capacity.runtimes.push_back(name);
  r.capacity.templates.push_back("base");
  // As a create names them: "name:tag" without the tenant's namespace, and the digest.
  for (const auto& [qualified, digest] : templates_.Tags()) {
    const size_t colon = qualified.rfind(':');
    if (colon == std::string::npos) continue;
    r.capacity.templates.push_back(SplitTemplateName(qualified.substr(0, colon)).name +
                                   qualified.substr(colon));
    r.capacity.templates.push_back(digest);
  }
  for (const auto& [key, ready] : pool_->Ready()) {
    // "runtime/template[/networked]": placement asks by template.
    const size_t a = key.find('/');
    if (a == std::string::npos) continue;
    const size_t b = key.find('/', a + 1);
    r.capacity.warm[key.substr(a + 1, b == std::string::npos ? b : b - a - 1)] += ready;
  }
  r.load.sandboxes = snap.holders;
  r.load.vcpu = snap.reserved.vcpu;
  r.load.memory_mib = snap.reserved.memory_mib;
  r.load.disk_mib = snap.reserved.disk_mib;
  return r;
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
