// Operations on an existing sandbox: delete, pause, suspend and wake. Which state allows which
// is data (sandbox_state.h); each is requested through the same skeleton (RequestOperation).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/digest.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"
#include "service/service_internal.h"
#include "service/tenancy.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

absl::StatusOr<Answer<OperationStarted>> SandboxService::DeleteSandbox(
    const Caller& caller, const std::string& id, const std::optional<Idempotency>& idem) {
  return RequestOperation(caller, id, Verb::kDelete, idem);
}

absl::StatusOr<Answer<OperationStarted>> SandboxService::RequestLifecycle(
    const Caller& caller, const std::string& id, const std::string& kind,
    const std::optional<Idempotency>& idem) {
  const std::optional<Verb> verb = VerbNamed(kind);
  if (!verb || *verb == Verb::kDelete) {
    return absl::InternalError(fmt::format("lifecycle: unknown operation kind '{}'", kind));
  }
  return RequestOperation(caller, id, *verb, idem);
}

absl::StatusOr<Answer<OperationStarted>> SandboxService::RequestOperation(
    const Caller& caller, const std::string& id, Verb verb,
    const std::optional<Idempotency>& idem) {
  const std::string kind(RulesOf(verb).name);
  const TimePoint requested = ServiceMetrics::Clock::now();
  // These calls take no body: every repeat of one is the same request.
  return Mutate<OperationStarted>(caller, idem, Sha256Hex(""),
                                  [&](Tx& tx) -> absl::StatusOr<Accepted<OperationStarted>> {
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, VisibleSandbox(tx, caller, id));
    Accepted<OperationStarted> out;
    out.from = sb.state;
    SBX_ASSIGN_OR_RETURN(StartedOperation started, StartOperation(tx, caller, sb, verb));
    out.result = OperationStarted{started.op};
    if (!started.is_new) return out;
    out.op_id = started.op.id;
    out.sandbox_id = id;
    out.to = sb.state;
    const std::string op_id = started.op.id;
    if (verb == Verb::kDelete) {
      out.job = [this, op_id, id, requested] { RunDelete(op_id, id, requested); };
    } else {
      out.job = [this, op_id, id, kind, requested] { RunLifecycle(op_id, id, kind, requested); };
    }
    return out;
  });
}

absl::StatusOr<SandboxService::StartedOperation> SandboxService::StartOperation(
    Tx& tx, const Caller& caller, SandboxRecord& sb, Verb verb) {
  const VerbRules& rules = RulesOf(verb);
  const std::string kind(rules.name);
  if (rules.needs_pause) {
    SBX_ASSIGN_OR_RETURN(runtime::Backend * backend, BackendFor(sb.runtime));
    if (!backend->GetCapabilities().pause) {
      return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                      fmt::format("runtime '{}' of sandbox {} cannot pause, suspend or wake "
                                  "sandboxes",
                                  sb.runtime, sb.id));
    }
  }
  if (sb.current_operation_id) {
    SBX_ASSIGN_OR_RETURN(OperationRecord cur, tx.GetOperation(*sb.current_operation_id));
    if (cur.state == "pending" || cur.state == "running") {
      // A repeat of the same kind returns the operation in flight.
      if (cur.kind == kind) return StartedOperation{std::move(cur), false};
      if (!rules.overtakes) {
        return WithDetail(
            ApiError(absl::StatusCode::kFailedPrecondition, "operation_in_progress",
                     fmt::format("sandbox {} has a {} operation in flight ({}); {} it when "
                                 "that one has finished",
                                 sb.id, cur.kind, cur.id, kind)),
            "operation_id", cur.id);
      }
    }
  }
  const Transition t = TransitionOf(sb.state, verb);
  if (t.answer == Transition::Answer::kRefuse) {
    return ApiError(absl::StatusCode::kFailedPrecondition, t.error,
                    fmt::format("cannot {} sandbox {}: it is {} ({})", kind, sb.id, sb.state,
                                rules.refused_because));
  }
  if (t.answer == Transition::Answer::kDone) {
    // Deleting is idempotent: a deleted sandbox answers with the delete that removed it.
    SBX_ASSIGN_OR_RETURN(auto ops, tx.ListOperations(sb.id));
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      if (it->kind == kind && it->state == "succeeded") return StartedOperation{*it, false};
    }
    return absl::InternalError(
        fmt::format("sandbox {} is {} but has no {} operation", sb.id, sb.state, kind));
  }
  if (verb == Verb::kWake && sb.state == "suspended") {
    // A suspended sandbox holds only its disk against the tenant's quotas; waking takes the
    // rest back.
    runtime::Resources r = ResourcesOf(sb.effective_resources, defaults());
    r.disk_mib = 0;
    SBX_RETURN_IF_ERROR(CheckSandboxQuota(tx, sb.tenant_id, r, /*new_sandbox=*/false));
  }
  // An overtaking operation (delete) is queued behind the one in flight on the same key, and
  // that one sees the new state when it finishes.
  const std::string now = NowRfc3339();
  OperationRecord op = NewOperation(caller.tenant_id, kind, sb.id, now);
  op.initiator = caller.initiator;
  op.node = opts_.node_name;
  if (!t.during.empty()) sb.state = std::string(t.during);
  sb.current_operation_id = op.id;
  sb.updated_at = now;
  SBX_RETURN_IF_ERROR(tx.PutOperation(op));
  SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
  return StartedOperation{std::move(op), true};
}

absl::Status SandboxService::DestroyRuntime(const SandboxRecord& sb) {
  // Another node's sandbox (deleted here because its node is lost): nothing of it is on this
  // host's runtime; its own node removes what it left when it comes back (Reconcile, Fence).
  if (!sb.node.empty() && sb.node != opts_.node_name) return absl::OkStatus();
  // The last denied-egress reading, while the sandbox's network still exists.
  ReadDeniedEgress(sb.id, /*baseline=*/false);
  runtime::InstancePtr inst;
  {
    std::lock_guard lock(mu_);
    inst = EraseInstanceLocked(sb.id);
    frozen_.erase(sb.id);  // Destroy kills frozen sandboxes too (kill, then thaw)
  }
  metrics_->ForgetEgress(sb.id);
  SBX_ASSIGN_OR_RETURN(runtime::Backend * backend, BackendFor(sb.runtime));
  if (!inst && !sb.runtime_state.is_null()) {
    auto adopted = backend->Adopt(sb.id, sb.runtime_state);
    if (adopted.ok()) inst = std::move(*adopted);
  }
  if (inst) return inst->Destroy();
  // Nothing alive to adopt: remove whatever is still named after the sandbox.
  return backend->Remove(sb.id);
}

void SandboxService::RunDelete(const std::string& op_id, const std::string& sandbox_id,
                               TimePoint requested) {
  const Job job{op_id, sandbox_id, "delete", requested, Clock::now()};
  // No cancelling: a delete always runs, also when re-driven after a restart.
  std::optional<SandboxRecord> sb = BeginJob(job, nullptr);
  if (!sb) return;
  const auto runtime_started = Clock::now();
  absl::Status destroyed = DestroyRuntime(*sb);
  const double runtime_ms = MsSince(runtime_started);
  std::vector<std::string> ended_sessions;
  // Given back before the operation is recorded as succeeded, not after: a client that saw
  // the delete succeed and creates at once must find the room free (the release after the
  // commit lost that race now and then). A destroy that failed may leave processes running:
  // the sandbox keeps what it held (and a restart counts its delete_failed state the same way).
  if (destroyed.ok()) {
    activity_.Forget(sandbox_id);
    ReleaseCapacity(sandbox_id);
  }
  absl::StatusOr<OperationRecord> finished = FinishJob(
      job, [&](Tx& tx, OperationRecord& op, SandboxRecord& cur,
               const std::string& now) -> absl::StatusOr<bool> {
        ended_sessions.clear();
        cur.updated_at = now;
        cur.current_operation_id.reset();
        if (!destroyed.ok()) {
          json err = ErrorJson("delete_failed", destroyed);
          Finish(op, false, err, now);
          cur.state = std::string(kFailed);
          cur.error = err;
          return true;
        }
        Finish(op, true, nullptr, now);
        cur.state = std::string(kDeleted);
        cur.runtime_state = nullptr;
        // Sessions end with their sandbox.
        SBX_ASSIGN_OR_RETURN(auto sessions, tx.ListSessions(sandbox_id));
        for (auto& s : sessions) {
          if (s.state == "exited") continue;
          s.state = "exited";
          if (!s.exit_code && !s.signal) s.signal = "SIGKILL";
          s.exited_at = now;
          SBX_RETURN_IF_ERROR(tx.PutSession(s));
          ended_sessions.push_back(s.id);
        }
        return true;
      },
      nullptr);
  if (finished.ok()) {
    for (const std::string& s : ended_sessions) metrics_->SessionExited(s, /*oom_killed=*/false);
  }
  const bool ok = finished.ok() && destroyed.ok();
  LogOperationFinished("delete", ok ? "succeeded" : "failed", job.started, runtime_ms,
                       !destroyed.ok() ? std::string(destroyed.message())
                                       : StoreError(finished.status()));
}

void SandboxService::RunLifecycle(const std::string& op_id, const std::string& sandbox_id,
                                  const std::string& kind, TimePoint requested) {
  const Job job{op_id, sandbox_id, kind, requested, Clock::now()};
  const Verb verb = VerbNamed(kind).value_or(Verb::kPause);
  std::optional<SandboxRecord> sb =
      BeginJob(job, [&](const OperationRecord&, const SandboxRecord& sb) {
        // A delete took over before this operation started: nothing to do.
        return sb.current_operation_id != op_id
                   ? std::optional<std::string>("sandbox was deleted first")
                   : std::nullopt;
      });
  if (!sb) return;

  // Jobs of one sandbox run one at a time (OperationEngine), and only a delete job removes the
  // instance: the pointer stays valid for this job without holding mu_ across the runtime call.
  const bool freeze = verb != Verb::kWake;
  runtime::Instance* inst = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sandbox_id);
    if (it != instances_.end()) inst = it->second.get();
    // Data-plane calls stop going to the agent before it freezes, not after.
    if (inst && freeze) frozen_.insert(sandbox_id);
  }
  const auto started = Clock::now();
  absl::Status done;
  nlohmann::json result = nullptr;
  if (inst == nullptr) {
    done = absl::FailedPreconditionError(
        fmt::format("{} {}: sbxd holds no runtime instance for it", kind, sandbox_id));
  } else if (verb == Verb::kSuspend) {
    absl::StatusOr<runtime::SuspendOutcome> out = inst->Suspend();
    done = out.status();
    if (out.ok()) {
      result = {{"memory_preserved", out->memory_preserved},
                {"memory_released", out->memory_released},
                {"memory", out->how}};
      if (out->memory_released) result["snapshot_bytes"] = out->snapshot_bytes;
    }
  } else {
    done = freeze ? inst->Freeze() : inst->Resume();
  }
  const double runtime_ms = MsSince(started);
  // What the kernel says decides where the sandbox stands, also after a failure.
  bool frozen = freeze ? done.ok() : !done.ok();
  if (inst && !done.ok()) {
    auto k = inst->IsFrozen();
    if (k.ok()) frozen = *k;
  }
  {
    std::lock_guard lock(mu_);
    if (frozen) {
      frozen_.insert(sandbox_id);
    } else {
      frozen_.erase(sandbox_id);
    }
  }

  absl::StatusOr<OperationRecord> finished = FinishJob(
      job, [&](Tx&, OperationRecord& op, SandboxRecord& cur,
               const std::string& now) -> absl::StatusOr<bool> {
        if (done.ok()) {
          Finish(op, true, nullptr, now);
          op.result = result;
        } else {
          Finish(op, false, ErrorJson(fmt::format("{}_failed", kind), done), now);
        }
        // A delete that took over meanwhile owns the sandbox's state now.
        if (cur.current_operation_id != op_id) return false;
        cur.current_operation_id.reset();
        cur.updated_at = now;
        const std::string_view after = TransitionOf(cur.state, verb).after;
        if (done.ok() && !after.empty()) {
          cur.state = std::string(after);
        } else if (!frozen) {
          cur.state = std::string(kRunning);
        } else if (!IsFrozenState(cur.state)) {
          cur.state = std::string(kPaused);  // failed to thaw a sandbox the store thought running
        }
        return true;
      });
  const bool ok = finished.ok() && done.ok();
  LogOperationFinished(kind, ok ? "succeeded" : "failed", job.started, runtime_ms,
                       !done.ok() ? std::string(done.message()) : StoreError(finished.status()));
}

}  // namespace sbx::service
