// Creating sandboxes: from the warm pool when one fits (done within the request), otherwise
// built by a create job (RunCreate).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/digest.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"
#include "service/service_internal.h"
#include "service/tenancy.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

absl::StatusOr<WarmSandbox> SandboxService::BuildWarm(const WarmPoolConfig& config) {
  SBX_ASSIGN_OR_RETURN(runtime::Backend* backend, BackendFor(config.runtime));
  SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec tmpl, templates_.Resolve(config.template_name));
  runtime::SandboxSpec spec;
  spec.id = NewId("sbx");
  spec.tmpl = tmpl;
  spec.resources = defaults();
  spec.hostname = spec.id.substr(0, 16);
  spec.network_ready = config.networked;
  // A pool member holds what a sandbox holds: the pool may fill only what creates left over.
  SBX_RETURN_IF_ERROR(admission_->Admit(spec.id, DemandOf(spec.resources), "a warm-pool sandbox"));
  // The runtime's lines during the build name the sandbox, as in an operation.
  log::Context lctx;
  lctx.sandbox = spec.id;
  log::Scope scope(lctx);
  auto inst = backend->Create(spec);
  if (!inst.ok()) {
    admission_->Release(spec.id);  // Create leaves nothing behind
    return inst.status();
  }
  // A pooled sandbox is handed out ready: its template's process runs and passed its check.
  if (absl::Status st = StartTemplateProcess(**inst, tmpl); !st.ok()) {
    (void)(*inst)->Destroy();
    admission_->Release(spec.id);
    return st;
  }
  return WarmSandbox{std::move(*inst), config.runtime,   config.template_name, tmpl.digest,
                     spec.resources,    config.networked, Revision(tmpl)};
}

std::string SandboxService::Revision(const runtime::TemplateSpec& t) {
  if (t.start_cmd.empty()) return t.digest;
  return fmt::format("{}#{}", t.digest,
                     Sha256Digest(nlohmann::json{t.start_cmd, t.ready_cmd, t.start_timeout_s}.dump()));
}

void SandboxService::TemplateChanged() {
  pool_->DrainStale([this](const std::string& name) -> std::optional<std::string> {
    auto t = templates_.Resolve(name);
    if (!t.ok()) return std::nullopt;
    return Revision(*t);
  });
}

std::optional<WarmSandbox> SandboxService::TakeWarm(const Caller& caller,
                                                    const CreateSandboxRequest& req,
                                                    const runtime::Resources& defaults,
                                                    const nlohmann::json& egress) {
  // Pooled sandboxes have the default limits; any other request is built cold. A `none` create
  // takes a loopback-only member, a networked one a network-ready member (never the other way:
  // a `none` sandbox must have no veth at all, docs/isolation.md §2.3a).
  if (!(EffectiveOf(req, defaults) == defaults)) return std::nullopt;
  auto tmpl = templates_.Resolve(req.template_ref, TemplateNamespaceOf(caller));
  if (!tmpl.ok()) return std::nullopt;
  const bool networked = !egress.is_null();
  std::optional<WarmSandbox> warm = pool_->Take(req.runtime.value_or(opts_.default_runtime),
                                                tmpl->name, Revision(*tmpl), defaults, networked);
  if (!warm || !networked) return warm;
  // Its rules exist before the create is answered, as for a cold networked create. Outside the
  // store transaction, which may run more than once.
  const auto started = Clock::now();
  absl::Status st = warm->instance->AttachEgress(egress);
  if (!st.ok()) {
    // Half-attached, maybe: never handed out, never pooled again. The create goes cold.
    spdlog::warn("warm pool: {} (the member is destroyed, the create is built cold)",
                 std::string(st.message()));
    pool_->Discard(std::move(*warm));
    return std::nullopt;
  }
  spdlog::debug("warm pool: {} given egress profile {} in {:.2f} ms", warm->instance->id(),
                egress.value("profile", ""), MsSince(started));
  return warm;
}

SandboxRecord SandboxService::NewSandbox(const Caller& caller, const CreateSandboxRequest& req,
                                         const runtime::TemplateSpec& tmpl) const {
  const std::string now = NowRfc3339();
  SandboxRecord sb;
  sb.tenant_id = caller.tenant_id;
  sb.state = std::string(kCreating);
  sb.template_ref = req.template_ref;
  sb.template_digest = tmpl.digest;
  sb.runtime = req.runtime.value_or(opts_.default_runtime);
  sb.egress_profile = req.egress_profile;
  sb.env = req.env;
  sb.labels = req.labels;
  // Stored as effective values, so a later change of the defaults (SIGHUP) does not move the
  // deadline of a sandbox that already exists.
  const TimerSettings timers = timer_settings();
  const int64_t ttl = req.timeout_s.value_or(timers.default_timeout_s);
  if (ttl > 0) sb.timeout_s = ttl;
  sb.idle_suspend_s = req.idle_suspend_s.value_or(timers.default_idle_suspend_s);
  sb.created_at = now;
  sb.updated_at = now;
  return sb;
}

absl::StatusOr<Answer<SandboxCreated>> SandboxService::CreateSandbox(
    const Caller& caller, const CreateSandboxRequest& req, const std::optional<Idempotency>& idem) {
  const TimePoint requested = ServiceMetrics::Clock::now();
  // Before anything is taken or recorded: a bad profile leaves nothing half-created.
  SBX_ASSIGN_OR_RETURN(const nlohmann::json egress, ResolveEgress(req));
  if (opts_.sync_template) {
    SBX_RETURN_IF_ERROR(opts_.sync_template(req.template_ref, TemplateNamespaceOf(caller)));
  }
  // Taken before the transaction, which may run more than once (busy retries); it goes back to
  // the pool unless the transaction records it.
  // One snapshot for the whole create: a reload meanwhile must not give a pooled sandbox built
  // with the old defaults the new ones' effective_resources.
  const runtime::Resources defaults = this->defaults();
  const runtime::Resources effective = EffectiveOf(req, defaults);
  std::optional<WarmSandbox> warm = TakeWarm(caller, req, defaults, egress);
  std::optional<OperationRecord> finished;  // the create, when the warm pool served it
  // The id this create holds capacity for; given back unless the transaction records it.
  std::optional<std::string> admitted;
  auto unadmit = [&] {
    if (admitted) ReleaseCapacity(*admitted);
    admitted.reset();
  };
  auto answer = Mutate<SandboxCreated>(caller, idem, Sha256Hex(req.canonical.dump()),
                                        [&](Tx& tx) -> absl::StatusOr<Accepted<SandboxCreated>> {
    finished.reset();
    unadmit();  // an earlier attempt of this transaction (busy retry) held it under another id
    SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec tmpl,
                         templates_.Resolve(req.template_ref, TemplateNamespaceOf(caller)));
    SandboxRecord sb = NewSandbox(caller, req, tmpl);
    sb.egress = egress;
    SBX_ASSIGN_OR_RETURN(runtime::Backend * backend, BackendFor(sb.runtime));
    if (absl::Status st = backend->CheckCreate(effective, !egress.is_null()); !st.ok()) {
      const bool field = st.code() == absl::StatusCode::kInvalidArgument;
      return ApiError(st.code(), field ? "invalid_argument" : "not_implemented", std::string(st.message()),
                      field ? "resources" : "runtime");
    }
    // The tenant's profiles and quotas: one row, read once, in this transaction.
    SBX_ASSIGN_OR_RETURN(std::optional<store::TenantRecord> tenant,
                         FindTenant(tx, caller.tenant_id));
    SBX_RETURN_IF_ERROR(CheckEgressProfile(tenant, req.egress_profile));
    // In the transaction that records the sandbox: concurrent creates cannot pass it together.
    SBX_RETURN_IF_ERROR(CheckSandboxQuota(tx, tenant, effective, /*new_sandbox=*/true));
    sb.id = warm ? warm->instance->id() : NewId("sbx");
    sb.node = opts_.node_name;
    sb.port_access = NewPortAccess(req.public_ports, sb.id);
    // Before anything is recorded or built. A pooled sandbox already holds its resources
    // (under the same id).
    if (!warm) {
      SBX_RETURN_IF_ERROR(admission_->Admit(sb.id, DemandOf(effective), "the sandbox"));
      admitted = sb.id;
    }
    sb.resources = RequestedResources(req);
    sb.effective_resources = EffectiveResources(effective, opts_.output_buffer_bytes);
    OperationRecord op = NewOperation(caller.tenant_id, "create", sb.id, sb.created_at);
    op.node = opts_.node_name;
    Accepted<SandboxCreated> out;
    if (warm) {
      // Already running: the create is done in this transaction.
      sb.state = std::string(kRunning);
      sb.runtime_state = warm->instance->Persist();
      Finish(op, true, nullptr, sb.created_at);
      op.result = {{"warm_pool", true}};
      finished = op;
      out.why = "from the warm pool";
    } else {
      sb.current_operation_id = op.id;
      const std::string op_id = op.id, sb_id = sb.id;
      out.job = [this, op_id, sb_id, requested] { RunCreate(op_id, sb_id, requested); };
    }
    SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    out.op_id = op.id;
    out.sandbox_id = sb.id;
    out.to = sb.state;
    out.result = SandboxCreated{std::move(sb), std::move(op)};
    return out;
  });
  const bool created = answer.ok() && answer->result;
  if (!created) unadmit();  // refused, failed, or a replay
  if (warm) {
    if (created && finished) {
      metrics_->OperationFinished(*finished, requested);
      metrics_->SandboxRunning(warm->runtime, /*warm=*/true, requested);
      std::lock_guard lock(mu_);
      instances_[warm->instance->id()] = std::move(warm->instance);
    } else if (warm->networked) {
      // Its network carries this create's rules now: not a pool member any more.
      pool_->Discard(std::move(*warm));
    } else {
      pool_->Return(std::move(*warm));
    }
  }
  return answer;
}

absl::StatusOr<runtime::InstancePtr> SandboxService::BuildInstance(const SandboxRecord& sb) {
  SBX_ASSIGN_OR_RETURN(runtime::Backend * backend, BackendFor(sb.runtime));
  // The release the sandbox was created from, wherever its tag points now: moving a tag never
  // changes a sandbox (its relaunch after a wake or a restart included).
  SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec tmpl,
                       templates_.ResolvePinned(sb.template_ref, sb.template_digest));
  runtime::SandboxSpec spec;
  spec.id = sb.id;
  spec.tmpl = tmpl;
  spec.resources = ResourcesOf(sb.effective_resources, defaults());
  // The sandbox env is applied per session (CreateSession), as for pooled sandboxes.
  spec.hostname = sb.id.substr(0, 16);
  spec.egress = sb.egress;
  SBX_ASSIGN_OR_RETURN(runtime::InstancePtr inst, backend->Create(spec));
  if (absl::Status st = StartTemplateProcess(*inst, tmpl); !st.ok()) {
    (void)inst->Destroy();
    return ApiError(st.code(), "template_start_failed", std::string(st.message()));
  }
  return inst;
}

void SandboxService::RunCreate(const std::string& op_id, const std::string& sandbox_id,
                               TimePoint requested) {
  const Job job{op_id, sandbox_id, "create", requested, Clock::now()};
  std::optional<SandboxRecord> sb =
      BeginJob(job, [](const OperationRecord&, const SandboxRecord& sb) {
        // A delete overtook this create before it started: nothing to build.
        return sb.state != kCreating
                   ? std::optional<std::string>("sandbox was deleted before it started")
                   : std::nullopt;
      });
  if (!sb) return;

  const auto started = Clock::now();
  absl::StatusOr<runtime::InstancePtr> inst = BuildInstance(*sb);
  const double runtime_ms = MsSince(started);
  json runtime_state = inst.ok() ? (*inst)->Persist() : json(nullptr);
  // Kept before the store says running: a client that sees the operation succeed may start a
  // session at once, and must find the agent. No delete can take it meanwhile (the engine runs
  // one job per sandbox at a time); if the store fails, it is taken back and destroyed.
  const bool built = inst.ok();
  if (built) {
    std::lock_guard lock(mu_);
    instances_[sandbox_id] = std::move(*inst);
  }
  std::string to;  // the sandbox's state after the job
  absl::StatusOr<OperationRecord> finished = FinishJob(
      job, [&](Tx&, OperationRecord& op, SandboxRecord& cur,
               const std::string& now) -> absl::StatusOr<bool> {
        cur.updated_at = now;
        if (!built) {
          // The template's own process failing is the template's fault, not the runtime's.
          json err = ErrorJson(ApiErrorCode(inst.status()) == "template_start_failed"
                                   ? "template_start_failed"
                                   : "create_failed",
                               inst.status());
          Finish(op, false, err, now);
          if (cur.state == kCreating) {
            cur.state = std::string(kFailed);
            cur.error = err;
            cur.current_operation_id.reset();
          }
        } else if (cur.state == kCreating) {
          Finish(op, true, nullptr, now);
          cur.state = std::string(kRunning);
          cur.runtime_state = runtime_state;
          cur.current_operation_id.reset();
        } else {
          // Deleted while being built: the queued delete destroys the instance we keep for it.
          Finish(op, false,
                 {{"code", "cancelled"}, {"message", "sandbox was deleted while starting"}}, now);
          cur.runtime_state = runtime_state;
        }
        to = cur.state;
        return true;
      },
      [&] {
        // A failed build leaves nothing behind; a sandbox deleted meanwhile is released by its
        // delete.
        if (to == kFailed) ReleaseCapacity(sandbox_id);
      });
  if (!finished.ok()) {
    // Nothing runs for it any more (destroyed below, or never built).
    ReleaseCapacity(sandbox_id);
    if (built) DropInstance(sandbox_id);
    LogOperationFinished("create", "failed", job.started, runtime_ms,
                         StoreError(finished.status()));
    return;
  }
  if (finished->state == "succeeded") {
    metrics_->SandboxRunning(sb->runtime, /*warm=*/false, requested);
  }
  LogOperationFinished("create", ResultOf(*finished), job.started, runtime_ms,
                       built ? std::string() : std::string(inst.status().message()));
}

void SandboxService::DropInstance(const std::string& sandbox_id) {
  runtime::InstancePtr mine;
  {
    std::lock_guard lock(mu_);
    mine = EraseInstanceLocked(sandbox_id);
  }
  if (mine) (void)mine->Destroy();
}

}  // namespace sbx::service
