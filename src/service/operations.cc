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
      engine_.Submit(accepted->sandbox_id, std::move(accepted->job), std::move(lctx));
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
