#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/encoding.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/service_internal.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"
#include "service/views.h"

namespace sbx::service {

using nlohmann::json;
using store::OperationRecord;
using store::SandboxRecord;
using store::Tx;
using namespace internal;  // this folder's helpers (service_internal.h)

// ---------------------------------------------------------------------------------------------
// Delete

absl::StatusOr<StoredResponse> SandboxService::DeleteSandbox(
    const Caller& caller, const std::string& id, const std::optional<std::string>& idem_key) {
  const IdemScope scope{"DELETE", "/v1/sandboxes/" + id};
  const TimePoint requested = ServiceMetrics::Clock::now();
  const std::string body_hash = Sha256Hex("");
  StoredResponse out;
  std::optional<std::string> submit;
  std::string from;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(auto replay, CheckIdempotency(tx, caller, idem_key, scope, body_hash));
    if (replay) {
      out = *replay;
      return absl::OkStatus();
    }
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, VisibleSandbox(tx, caller, id));
    const std::string now = NowRfc3339();
    OperationRecord op;
    if (sb.current_operation_id) {
      SBX_ASSIGN_OR_RETURN(OperationRecord cur, tx.GetOperation(*sb.current_operation_id));
      if (cur.kind == "delete" && (cur.state == "pending" || cur.state == "running")) {
        op = cur;  // a repeat of the same kind returns the in-flight operation
      }
    }
    if (op.id.empty() && sb.state == kDeleted) {
      // Deleting is idempotent: a deleted sandbox answers with the delete that removed it.
      SBX_ASSIGN_OR_RETURN(auto ops, tx.ListOperations(sb.id));
      for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
        if (it->kind == "delete" && it->state == "succeeded") {
          op = *it;
          break;
        }
      }
    }
    if (op.id.empty() && sb.state == kDeleted) {
      return absl::InternalError(fmt::format("sandbox {} is deleted but has no delete operation",
                                             sb.id));
    } else if (op.id.empty()) {
      // Delete wins over any other in-flight operation: it is queued behind it on the same
      // key, and the other operation sees the new state when it finishes.
      op = NewOperation(caller.tenant_id, "delete", sb.id, now);
      op.initiator = caller.initiator;
      from = sb.state;
      sb.state = std::string(kDeleting);
      sb.current_operation_id = op.id;
      sb.updated_at = now;
      SBX_RETURN_IF_ERROR(tx.PutOperation(op));
      SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
      submit = op.id;
    }
    out.status = 202;
    out.body = json{{"operation", OperationView(op)}}.dump();
    return SaveIdempotency(tx, caller, idem_key, scope, body_hash, out);
  }));
  if (submit) {
    std::string op_id = *submit;
    log::Context lctx = OperationLog(op_id, id, caller.tenant_id);
    {
      log::Scope scope(lctx);
      LogStateChange(id, from, kDeleting);
    }
    engine_.Submit(id, [this, op_id, id, requested] { RunDelete(op_id, id, requested); },
                   std::move(lctx));
  }
  return out;
}

absl::Status SandboxService::DestroyRuntime(const SandboxRecord& sb) {
  // The last denied-egress reading, while the sandbox's network still exists.
  ReadDeniedEgress(sb.id, /*baseline=*/false);
  runtime::InstancePtr inst;
  {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sb.id);
    if (it != instances_.end()) {
      inst = std::move(it->second);
      instances_.erase(it);
    }
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
  const auto job_started = Clock::now();
  SandboxRecord sb;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    SBX_ASSIGN_OR_RETURN(sb, tx.GetSandbox(sandbox_id));
    op.state = "running";
    op.updated_at = NowRfc3339();
    return tx.PutOperation(op);
  });
  if (!st.ok()) {
    spdlog::error("delete {}: store: {}", sandbox_id, std::string(st.message()));
    return;
  }
  LogOperationStarted("delete");
  const auto runtime_started = Clock::now();
  absl::Status destroyed = DestroyRuntime(sb);
  const double runtime_ms = MsSince(runtime_started);
  std::string from, to;
  std::optional<OperationRecord> finished;
  std::vector<std::string> ended_sessions;
  st = store_.Transact([&](Tx& tx) -> absl::Status {
    finished.reset();
    ended_sessions.clear();
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    SBX_ASSIGN_OR_RETURN(SandboxRecord cur, tx.GetSandbox(sandbox_id));
    const std::string now = NowRfc3339();
    from = cur.state;
    cur.updated_at = now;
    cur.current_operation_id.reset();
    if (destroyed.ok()) {
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
    } else {
      json err = ErrorJson("delete_failed", destroyed);
      Finish(op, false, err, now);
      cur.state = std::string(kFailed);
      cur.error = err;
    }
    to = cur.state;
    finished = op;
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    return tx.PutSandbox(cur);
  });
  if (destroyed.ok()) {
    activity_.Forget(sandbox_id);
    // A destroy that failed may leave processes running: the sandbox keeps what it held (and
    // a restart counts its delete_failed state the same way).
    ReleaseCapacity(sandbox_id);
  }
  if (st.ok()) {
    metrics_->OperationFinished(*finished, requested);
    for (const std::string& s : ended_sessions) metrics_->SessionExited(s, /*oom_killed=*/false);
  }
  if (!st.ok()) {
    spdlog::error("delete {}: store: {}", sandbox_id, std::string(st.message()));
  } else {
    LogStateChange(sandbox_id, from, to);
  }
  const bool ok = st.ok() && destroyed.ok();
  LogOperationFinished(
      "delete", ok ? "succeeded" : "failed", job_started, runtime_ms,
      !destroyed.ok() ? std::string(destroyed.message())
      : !st.ok()      ? fmt::format("store: {}", std::string(st.message()))
                      : std::string());
}

// ---------------------------------------------------------------------------------------------
// Pause, suspend, wake

absl::StatusOr<StoredResponse> SandboxService::RequestLifecycle(
    const Caller& caller, const std::string& id, const std::string& kind,
    const std::optional<std::string>& idem_key) {
  if (kind != "pause" && kind != "suspend" && kind != "wake") {
    return absl::InternalError(fmt::format("lifecycle: unknown operation kind '{}'", kind));
  }
  // These calls take no body: every repeat of one is the same request.
  const IdemScope scope{"POST", fmt::format("/v1/sandboxes/{}/{}", id, kind)};
  const TimePoint requested = ServiceMetrics::Clock::now();
  const std::string body_hash = Sha256Hex("");
  StoredResponse out;
  std::optional<std::string> submit;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(auto replay, CheckIdempotency(tx, caller, idem_key, scope, body_hash));
    if (replay) {
      out = *replay;
      return absl::OkStatus();
    }
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, VisibleSandbox(tx, caller, id));
    SBX_ASSIGN_OR_RETURN(runtime::Backend * backend, BackendFor(sb.runtime));
    if (!backend->GetCapabilities().pause) {
      return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                      fmt::format("runtime '{}' of sandbox {} cannot pause, suspend or wake "
                                  "sandboxes",
                                  sb.runtime, sb.id));
    }
    OperationRecord op;
    if (sb.current_operation_id) {
      SBX_ASSIGN_OR_RETURN(OperationRecord cur, tx.GetOperation(*sb.current_operation_id));
      if (cur.state == "pending" || cur.state == "running") {
        if (cur.kind != kind) {
          return WithDetail(
              ApiError(absl::StatusCode::kFailedPrecondition, "operation_in_progress",
                       fmt::format("sandbox {} has a {} operation in flight ({}); {} it when "
                                   "that one has finished",
                                   sb.id, cur.kind, cur.id, kind)),
              "operation_id", cur.id);
        }
        op = cur;  // a repeat of the same kind returns the in-flight operation
      }
    }
    if (op.id.empty()) {
      const bool allowed = kind == "wake" ? IsFrozenState(sb.state) : sb.state == kRunning;
      if (!allowed) {
        return ApiError(absl::StatusCode::kFailedPrecondition, "invalid_state",
                        fmt::format("cannot {} sandbox {}: it is {} ({})", kind, sb.id, sb.state,
                                    kind == "wake" ? "only a paused or suspended sandbox wakes"
                                                   : "only a running sandbox can be paused or "
                                                     "suspended"));
      }
      const std::string now = NowRfc3339();
      op = NewOperation(caller.tenant_id, kind, sb.id, now);
      op.initiator = caller.initiator;
      sb.current_operation_id = op.id;
      sb.updated_at = now;
      SBX_RETURN_IF_ERROR(tx.PutOperation(op));
      SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
      submit = op.id;
    }
    out.status = 202;
    out.body = json{{"operation", OperationView(op)}}.dump();
    return SaveIdempotency(tx, caller, idem_key, scope, body_hash, out);
  }));
  if (submit) {
    std::string op_id = *submit;
    engine_.Submit(id, [this, op_id, id, kind, requested] {
      RunLifecycle(op_id, id, kind, requested);
    }, OperationLog(op_id, id, caller.tenant_id));
  }
  return out;
}

void SandboxService::RunLifecycle(const std::string& op_id, const std::string& sandbox_id,
                                  const std::string& kind, TimePoint requested) {
  const auto job_started = Clock::now();
  bool proceed = false;
  bool cancelled = false;
  std::optional<OperationRecord> finished;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    finished.reset();
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, tx.GetSandbox(sandbox_id));
    if (op.state != "pending") return absl::OkStatus();
    const std::string now = NowRfc3339();
    if (sb.current_operation_id != op_id) {
      // A delete took over before this operation started: nothing to do.
      Finish(op, false, {{"code", "cancelled"}, {"message", "sandbox was deleted first"}}, now);
      cancelled = true;
      finished = op;
      return tx.PutOperation(op);
    }
    op.state = "running";
    op.updated_at = now;
    proceed = true;
    return tx.PutOperation(op);
  });
  if (st.ok() && finished) metrics_->OperationFinished(*finished, requested);
  if (!st.ok() || !proceed) {
    if (!st.ok()) spdlog::error("{} {}: store: {}", kind, sandbox_id, std::string(st.message()));
    if (st.ok() && cancelled) {
      LogOperationFinished(kind, "cancelled", job_started, -1, "sandbox was deleted first");
    }
    return;
  }
  LogOperationStarted(kind);

  // Jobs of one sandbox run one at a time (OperationEngine), and only a delete job removes the
  // instance: the pointer stays valid for this job without holding mu_ across the runtime call.
  runtime::Instance* inst = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sandbox_id);
    if (it != instances_.end()) inst = it->second.get();
    // Data-plane calls stop going to the agent before it freezes, not after.
    if (inst && kind != "wake") frozen_.insert(sandbox_id);
  }
  const bool freeze = kind != "wake";
  auto started = std::chrono::steady_clock::now();
  absl::Status done =
      inst == nullptr
          ? absl::FailedPreconditionError(
                fmt::format("{} {}: sbxd holds no runtime instance for it", kind, sandbox_id))
          : (freeze ? inst->Freeze() : inst->Thaw());
  auto elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started);
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

  std::string from, to;
  st = store_.Transact([&](Tx& tx) -> absl::Status {
    finished.reset();
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    SBX_ASSIGN_OR_RETURN(SandboxRecord cur, tx.GetSandbox(sandbox_id));
    const std::string now = NowRfc3339();
    from = to = cur.state;
    if (done.ok()) {
      Finish(op, true, nullptr, now);
    } else {
      Finish(op, false, ErrorJson(fmt::format("{}_failed", kind), done), now);
    }
    finished = op;
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    // A delete that took over meanwhile owns the sandbox's state now.
    if (cur.current_operation_id != op_id) return absl::OkStatus();
    cur.current_operation_id.reset();
    cur.updated_at = now;
    if (!frozen) {
      cur.state = std::string(kRunning);
    } else if (done.ok()) {
      cur.state = std::string(kind == "suspend" ? kSuspended : kPaused);
    } else if (!IsFrozenState(cur.state)) {
      cur.state = std::string(kPaused);  // failed to thaw a sandbox the store thought running
    }
    to = cur.state;
    return tx.PutSandbox(cur);
  });
  if (st.ok()) metrics_->OperationFinished(*finished, requested);
  if (!st.ok()) {
    spdlog::error("{} {}: store: {}", kind, sandbox_id, std::string(st.message()));
  } else {
    LogStateChange(sandbox_id, from, to);
  }
  const bool ok = st.ok() && done.ok();
  LogOperationFinished(kind, ok ? "succeeded" : "failed", job_started, elapsed.count(),
                       !done.ok() ? std::string(done.message())
                       : !st.ok() ? fmt::format("store: {}", std::string(st.message()))
                                  : std::string());
}

}  // namespace sbx::service
