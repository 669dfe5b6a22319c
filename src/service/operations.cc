// The skeleton every operation shares: its request (Mutate: an idempotent transaction that
// records it, then its job submitted) and its job's first and last steps (BeginJob, FinishJob).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/sandbox_service.h"
#include "service/service_internal.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

template <typename T>
absl::StatusOr<Answer<T>> SandboxService::Mutate(
    const Caller& caller, const std::optional<Idempotency>& idem, const std::string& body_hash,
    const std::function<absl::StatusOr<Accepted<T>>(Tx&)>& fn) {
  Answer<T> out;
  std::optional<Accepted<T>> accepted;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    accepted.reset();
    SBX_ASSIGN_OR_RETURN(out.replay, CheckIdempotency(tx, caller, idem, body_hash));
    if (out.replay) return absl::OkStatus();
    SBX_ASSIGN_OR_RETURN(accepted, fn(tx));
    return SaveIdempotency(tx, caller, idem, body_hash, Result(accepted->result));
  }));
  if (!accepted) return out;  // a replay
  if (!accepted->op_id.empty()) {
    log::Context lctx = OperationLog(accepted->op_id, accepted->sandbox_id, caller.tenant_id);
    {
      log::Scope scope(lctx);
      LogStateChange(accepted->sandbox_id, accepted->from, accepted->to, accepted->why);
    }
    if (accepted->job) {
      SubmitJob(accepted->op_id, accepted->sandbox_id, std::move(accepted->job), std::move(lctx));
    }
  }
  out.result = std::move(accepted->result);
  return out;
}

template absl::StatusOr<Answer<SandboxCreated>> SandboxService::Mutate(
    const Caller&, const std::optional<Idempotency>&, const std::string&,
    const std::function<absl::StatusOr<Accepted<SandboxCreated>>(Tx&)>&);
template absl::StatusOr<Answer<OperationStarted>> SandboxService::Mutate(
    const Caller&, const std::optional<Idempotency>&, const std::string&,
    const std::function<absl::StatusOr<Accepted<OperationStarted>>(Tx&)>&);
template absl::StatusOr<Answer<SessionCreated>> SandboxService::Mutate(
    const Caller&, const std::optional<Idempotency>&, const std::string&,
    const std::function<absl::StatusOr<Accepted<SessionCreated>>(Tx&)>&);

std::optional<SandboxRecord> SandboxService::BeginJob(const Job& job,
                                                      const CancelCheck& cancelled) {
  SandboxRecord sb;
  bool proceed = false;
  std::optional<std::string> why;  // the operation was cancelled
  std::optional<OperationRecord> finished;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    proceed = false;
    why.reset();
    finished.reset();
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(job.op_id));
    SBX_ASSIGN_OR_RETURN(sb, tx.GetSandbox(job.sandbox_id));
    const std::string now = NowRfc3339();
    if (cancelled) {
      if (op.state != "pending") return absl::OkStatus();
      why = cancelled(op, sb);
      if (why) {
        Finish(op, false, {{"code", "cancelled"}, {"message", *why}}, now);
        finished = op;
        return tx.PutOperation(op);
      }
    }
    op.state = "running";
    op.updated_at = now;
    proceed = true;
    return tx.PutOperation(op);
  });
  if (!st.ok()) {
    spdlog::error("{} {}: store: {}", job.kind, job.sandbox_id, std::string(st.message()));
    return std::nullopt;
  }
  if (finished) {
    metrics_->OperationFinished(*finished, job.requested);
    LogOperationFinished(job.kind, "cancelled", job.started, -1, *why);
  }
  if (!proceed) return std::nullopt;
  LogOperationStarted(job.kind);
  return sb;
}

void SandboxService::SubmitJob(const std::string& op_id, const std::string& sandbox_id,
                               std::function<void()> job, log::Context lctx) {
  engine_.Submit(
      sandbox_id,
      [this, op_id, sandbox_id, job = std::move(job)] {
        try {
          job();
        } catch (const std::exception& e) {
          FailThrownJob(op_id, sandbox_id, e.what());
        } catch (...) {
          FailThrownJob(op_id, sandbox_id, "an exception that is not a std::exception");
        }
      },
      std::move(lctx));
}

void SandboxService::FailThrownJob(const std::string& op_id, const std::string& sandbox_id,
                                   const std::string& what) {
  spdlog::error("operation {} of {} threw (a bug in sbxd): {}", op_id, sandbox_id, what);
  const std::string message = "sbxd failed internally during the operation: " + what;
  std::optional<OperationRecord> finished;
  std::string from;
  bool moved = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    finished.reset();
    moved = false;
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    if (op.state != "pending" && op.state != "running") return absl::OkStatus();
    const std::string now = NowRfc3339();
    Finish(op, false, {{"code", "internal"}, {"message", message}}, now);
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    finished = op;
    absl::StatusOr<SandboxRecord> sb = tx.GetSandbox(sandbox_id);
    if (!sb.ok()) return absl::IsNotFound(sb.status()) ? absl::OkStatus() : sb.status();
    if (sb->current_operation_id != op_id) return absl::OkStatus();
    from = sb->state;
    sb->state = std::string(kFailed);
    sb->error = {{"code", "internal"}, {"message", message}};
    sb->current_operation_id.reset();
    sb->updated_at = now;
    moved = true;
    return tx.PutSandbox(*sb);
  });
  if (!st.ok()) {
    spdlog::error("operation {}: store, failing it after the throw: {}", op_id,
                  std::string(st.message()));
    return;
  }
  if (!finished) return;  // the job finished its operation before it threw
  metrics_->OperationFinished(*finished, std::nullopt);
  if (moved) LogStateChange(sandbox_id, from, kFailed, message);
}

absl::StatusOr<OperationRecord> SandboxService::FinishJob(
    const Job& job, const FinishStep& apply, const std::function<void()>& committed) {
  std::string from, to;
  OperationRecord finished;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(finished, tx.GetOperation(job.op_id));
    SBX_ASSIGN_OR_RETURN(SandboxRecord cur, tx.GetSandbox(job.sandbox_id));
    from = cur.state;
    SBX_ASSIGN_OR_RETURN(bool changed, apply(tx, finished, cur, NowRfc3339()));
    to = cur.state;
    SBX_RETURN_IF_ERROR(tx.PutOperation(finished));
    return changed ? tx.PutSandbox(cur) : absl::OkStatus();
  });
  if (!st.ok()) {
    spdlog::error("{} {}: store: {}", job.kind, job.sandbox_id, std::string(st.message()));
    return st;
  }
  if (committed) committed();
  metrics_->OperationFinished(finished, job.requested);
  LogStateChange(job.sandbox_id, from, to);
  return finished;
}

}  // namespace sbx::service
