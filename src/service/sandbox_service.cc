#include "service/sandbox_service.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <set>

#include "common/encoding.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/sandbox_state.h"
#include "service/views.h"

namespace sbx::service {
namespace {

using nlohmann::json;
using store::OperationRecord;
using store::SandboxRecord;
using store::SessionRecord;
using store::Tx;

absl::Status BadId(std::string_view kind, const std::string& id) {
  std::string shown = id.size() > 64 ? id.substr(0, 64) + "..." : id;
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                  fmt::format("'{}' is not a {} id", shown, kind), "id");
}

// effective_resources of a new sandbox: what it was asked for, the rest from the deployment.
json EffectiveResources(const CreateSandboxRequest& req, const runtime::Resources& d,
                        int64_t output_buffer_bytes) {
  return {{"vcpu", req.vcpu.value_or(d.vcpu)},
          {"memory_mib", req.memory_mib.value_or(d.memory_mib)},
          {"disk_mib", req.disk_mib.value_or(d.disk_mib)},
          {"pids", d.pids},
          {"open_files", d.open_files},
          {"tmp_mib", d.tmp_mib},
          {"shm_mib", d.shm_mib},
          {"output_buffer_bytes", output_buffer_bytes}};
}

// Sandboxes stored before a key existed get today's deployment default for it, both when
// (re)launched and when shown.
int IntOr(const json& eff, const char* key, int fallback) {
  if (!eff.is_object()) return fallback;
  auto it = eff.find(key);
  return it != eff.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

runtime::Resources ResourcesOf(const json& eff, const runtime::Resources& d) {
  runtime::Resources r;
  r.vcpu = IntOr(eff, "vcpu", d.vcpu);
  r.memory_mib = IntOr(eff, "memory_mib", d.memory_mib);
  r.disk_mib = IntOr(eff, "disk_mib", d.disk_mib);
  r.pids = IntOr(eff, "pids", d.pids);
  r.open_files = IntOr(eff, "open_files", d.open_files);
  r.tmp_mib = IntOr(eff, "tmp_mib", d.tmp_mib);
  r.shm_mib = IntOr(eff, "shm_mib", d.shm_mib);
  return r;
}

Demand DemandOf(const runtime::Resources& r) {
  return Demand{r.vcpu, r.memory_mib, r.disk_mib};
}

// Whether a stored sandbox holds host resources (admission.h): everything that may still have
// processes or a disk, frozen ones included. A failed sandbox holds nothing, except one whose
// destroy failed: its processes may still run.
bool HoldsResources(const SandboxRecord& sb) {
  if (sb.state == kFailed) {
    return sb.error.is_object() && sb.error.value("code", "") == "delete_failed";
  }
  return sb.state == kCreating || sb.state == kRunning || IsFrozenState(sb.state) ||
         sb.state == kDeleting;
}

void FillEffectiveDefaults(SandboxRecord& sb, const runtime::Resources& defaults,
                           int64_t output_buffer_bytes) {
  const runtime::Resources r = ResourcesOf(sb.effective_resources, defaults);
  json eff = sb.effective_resources.is_object() ? sb.effective_resources : json::object();
  for (const auto& [k, v] : {std::pair<const char*, int>{"vcpu", r.vcpu},
                             {"memory_mib", r.memory_mib},
                             {"disk_mib", r.disk_mib},
                             {"pids", r.pids},
                             {"open_files", r.open_files},
                             {"tmp_mib", r.tmp_mib},
                             {"shm_mib", r.shm_mib}}) {
    if (!eff.contains(k)) eff[k] = v;
  }
  if (!eff.contains("output_buffer_bytes")) eff["output_buffer_bytes"] = output_buffer_bytes;
  sb.effective_resources = std::move(eff);
}

absl::Status NotFound(std::string_view kind, const std::string& id) {
  return ApiError(absl::StatusCode::kNotFound, "not_found",
                  fmt::format("{} {} not found", kind, id));
}

json ErrorJson(std::string_view code, const absl::Status& s) {
  return {{"code", code}, {"message", std::string(s.message())}};
}

// Idempotency scope is (tenant, method, route template, key); the body hash decides between a
// replay and a conflict.
struct IdemScope {
  std::string method;
  std::string route;
};

absl::StatusOr<std::optional<StoredResponse>> CheckIdempotency(Tx& tx, const Caller& caller,
                                                               const std::optional<std::string>& key,
                                                               const IdemScope& scope,
                                                               const std::string& body_hash) {
  if (!key) return std::optional<StoredResponse>();
  SBX_ASSIGN_OR_RETURN(auto rec,
                       tx.GetIdempotency(caller.tenant_id, *key, scope.method, scope.route));
  if (!rec) return std::optional<StoredResponse>();
  if (rec->body_hash != body_hash) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "idempotency_key_reused",
                    "Idempotency-Key was already used with a different request body");
  }
  return std::optional<StoredResponse>(StoredResponse{rec->status, rec->response_body, true});
}

absl::Status SaveIdempotency(Tx& tx, const Caller& caller, const std::optional<std::string>& key,
                             const IdemScope& scope, const std::string& body_hash,
                             const StoredResponse& resp) {
  if (!key) return absl::OkStatus();
  store::IdempotencyRecord rec;
  rec.tenant_id = caller.tenant_id;
  rec.key = *key;
  rec.method = scope.method;
  rec.route = scope.route;
  rec.body_hash = body_hash;
  rec.status = resp.status;
  rec.response_body = resp.body;
  rec.created_at = NowRfc3339();
  return tx.PutIdempotency(rec);
}

OperationRecord NewOperation(const std::string& tenant, const std::string& kind,
                             const std::string& sandbox_id, const std::string& now) {
  OperationRecord op;
  op.id = NewId("op");
  op.tenant_id = tenant;
  op.kind = kind;
  op.sandbox_id = sandbox_id;
  op.state = "pending";
  op.created_at = now;
  op.updated_at = now;
  return op;
}

// The log context of an operation's job: the request that asked for it (its request_id comes
// from the caller's scope, see api.cc) plus the operation, its sandbox and tenant.
log::Context OperationLog(const std::string& op_id, const std::string& sandbox_id,
                          const std::string& tenant) {
  log::Context c = log::Current();
  c.operation = op_id;
  c.sandbox = sandbox_id;
  c.tenant = tenant;
  return c;
}

// One line per committed state change of a sandbox ("" is a sandbox that did not exist).
void LogStateChange(const std::string& sandbox_id, std::string_view from, std::string_view to,
                    std::string_view why = {}) {
  if (!spdlog::should_log(spdlog::level::info) || from == to) return;
  log::Context c;
  c.sandbox = sandbox_id;
  log::Scope scope(c);
  log::Event(spdlog::level::info, {{"from", from}, {"to", to}}, "sandbox {}: {} -> {}{}{}{}",
             sandbox_id, from.empty() ? "new" : from, to, why.empty() ? "" : " (", why,
             why.empty() ? "" : ")");
}

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// "operation <kind> started" and "operation <kind> <result> in N ms": the two lines an operator
// looks for when a sandbox seems stuck. Logged on the engine's worker, whose scope supplies the
// operation, sandbox and tenant fields.
void LogOperationStarted(std::string_view kind) {
  log::Event(spdlog::level::info, {{"kind", kind}}, "operation {} started", kind);
}

void LogOperationFinished(std::string_view kind, std::string_view result, Clock::time_point started,
                          double runtime_ms = -1, std::string_view error = {}) {
  const double ms = MsSince(started);
  const auto level = result == "failed" ? spdlog::level::warn : spdlog::level::info;
  const std::string runtime =
      runtime_ms >= 0 ? fmt::format(" ({:.1f} ms in the runtime)", runtime_ms) : std::string();
  if (runtime_ms >= 0) {
    log::Event(level,
               {{"kind", kind}, {"result", result}, {"duration_ms", ms}, {"runtime_ms", runtime_ms}},
               "operation {} {} in {:.1f} ms{}{}{}", kind, result, ms, runtime,
               error.empty() ? "" : ": ", error);
  } else {
    log::Event(level, {{"kind", kind}, {"result", result}, {"duration_ms", ms}},
               "operation {} {} in {:.1f} ms{}{}", kind, result, ms, error.empty() ? "" : ": ",
               error);
  }
}

void Finish(OperationRecord& op, bool ok, json error, const std::string& now) {
  op.state = ok ? "succeeded" : "failed";
  op.error = std::move(error);
  op.updated_at = now;
  op.completed_at = now;
}

}  // namespace

SandboxService::SandboxService(ServiceOptions opts, store::Store& store,
                               ops::OperationEngine& engine, TemplateRegistry templates,
                               std::map<std::string, runtime::Backend*> backends)
    : opts_(std::move(opts)),
      store_(store),
      engine_(engine),
      templates_(std::move(templates)),
      backends_(std::move(backends)),
      tokens_(opts_.attach_key, opts_.attach_token_ttl),
      defaults_(opts_.defaults),
      timer_settings_(opts_.timers),
      guest_replies_(opts_.guest_replies) {
  engine_.SetJobDoneHook([this](const std::string& sandbox_id) { waiters_.Notify(sandbox_id); });
  std::vector<std::string> runtimes;
  for (const auto& [name, backend] : backends_) runtimes.push_back(name);
  metrics_ = std::make_unique<ServiceMetrics>(
      opts_.metrics != nullptr ? *opts_.metrics : metrics::Default(), runtimes,
      opts_.default_runtime);
  admission_ = std::make_unique<Admission>(opts_.admission, opts_.host_capacity);
  pool_ = std::make_unique<WarmPool>(
      opts_.warm_pools, [this](const WarmPoolConfig& c) { return BuildWarm(c); },
      [this](const std::string& id) { admission_->Release(id); });
  RegisterMetricCallbacks();
}

void SandboxService::RegisterMetricCallbacks() {
  metrics::Registry& registry = metrics_->registry();
  metric_callbacks_.push_back(registry.AddCallback(
      "sbx_sandboxes",
      "Sandboxes by state, read from the store at scrape time (deleted ones are not counted).",
      metrics::Type::kGauge, {"state"}, [this](metrics::CallbackSamples& out) {
        std::map<std::string, int64_t> counts;
        absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
          SBX_ASSIGN_OR_RETURN(counts, tx.CountLiveSandboxesByState());
          return absl::OkStatus();
        });
        if (!st.ok()) {
          // Absent rather than wrong: a scrape without the series shows the gap.
          spdlog::warn("metrics: sbx_sandboxes: {}", std::string(st.message()));
          return;
        }
        for (std::string_view state : kLiveStates) {
          auto it = counts.find(std::string(state));
          out.Add({std::string(state)}, it == counts.end() ? 0.0 : static_cast<double>(it->second));
        }
      }));
  // Admission (admission.h): what may be promised, and what is promised. Memory and disk in
  // bytes, CPUs as vCPUs; absent while the host's capacity cannot be read.
  struct Gauge {
    const char* name;
    const char* help;
    bool capacity;
    int64_t Demand::*member;
    int64_t scale;
  };
  static constexpr Gauge kGauges[] = {
      {"sbx_capacity_vcpus", "vCPUs admission may promise to sandboxes (host x overcommit).",
       true, &Demand::vcpu, 1},
      {"sbx_capacity_memory_bytes",
       "Memory admission may promise to sandboxes (host x overcommit - reserve).", true,
       &Demand::memory_mib, 1 << 20},
      {"sbx_capacity_disk_bytes",
       "Disk admission may promise to sandboxes ((free + already allocated) x overcommit - "
       "reserve).",
       true, &Demand::disk_mib, 1 << 20},
      {"sbx_reserved_vcpus", "vCPUs held by sandboxes and warm-pool members.", false,
       &Demand::vcpu, 1},
      {"sbx_reserved_memory_bytes", "Memory limits held by sandboxes and warm-pool members.",
       false, &Demand::memory_mib, 1 << 20},
      {"sbx_reserved_disk_bytes", "Disk caps held by sandboxes and warm-pool members.", false,
       &Demand::disk_mib, 1 << 20},
  };
  for (const Gauge& g : kGauges) {
    metric_callbacks_.push_back(registry.AddCallback(
        g.name, g.help, metrics::Type::kGauge, {}, [this, g](metrics::CallbackSamples& out) {
          const Admission::Snapshot snap = admission_->Read();
          if (g.capacity && !snap.probed) return;
          const Demand& d = g.capacity ? snap.capacity : snap.reserved;
          out.Add({}, static_cast<double>(d.*g.member) * static_cast<double>(g.scale));
        }));
  }
  metric_callbacks_.push_back(registry.AddCallback(
      "sbx_warm_pool_ready", "Sandboxes ready in the warm pool, by runtime and template.",
      metrics::Type::kGauge, {"runtime", "template"}, [this](metrics::CallbackSamples& out) {
        for (const auto& p : pool_->Stats()) out.Add({p.runtime, p.template_name}, p.ready);
      }));
  metric_callbacks_.push_back(registry.AddCallback(
      "sbx_warm_pool_target",
      "The number of sandboxes the warm pool keeps ready, by runtime and template.",
      metrics::Type::kGauge, {"runtime", "template"}, [this](metrics::CallbackSamples& out) {
        for (const auto& p : pool_->Stats()) out.Add({p.runtime, p.template_name}, p.target);
      }));
}

void SandboxService::StartWarmPools() {
  if (!ready()) {
    spdlog::error("warm pools not started: the service has not reconciled yet");
    return;
  }
  pool_->Start();
}

runtime::Resources SandboxService::defaults() const {
  std::lock_guard lock(defaults_mu_);
  return defaults_;
}

TimerSettings SandboxService::timer_settings() const {
  std::lock_guard lock(defaults_mu_);
  return timer_settings_;
}

absl::Status SandboxService::Reconfigure(const LiveOptions& live) {
  for (const auto& p : live.warm_pools) {
    if (p.size <= 0) continue;
    const std::string what = fmt::format("warm pool {}={}", p.template_name, p.size);
    SBX_RETURN_IF_ERROR(Annotate(templates_.Resolve(p.template_name).status(), what));
    SBX_RETURN_IF_ERROR(Annotate(BackendFor(p.runtime).status(), what));
  }
  bool defaults_changed = false;
  {
    std::lock_guard lock(defaults_mu_);
    defaults_changed = !(defaults_ == live.defaults);
    defaults_ = live.defaults;
    timer_settings_ = live.timers;
  }
  tokens_.SetTtl(live.attach_token_ttl);
  admission_->SetSettings(live.admission);
  // Larger ratios may have made room for a pool that waits.
  pool_->CapacityFreed();
  pool_->Resize(live.warm_pools);
  // Pooled sandboxes carry the old limits: Take would skip them anyway, one create at a time.
  if (defaults_changed) {
    pool_->Flush();
    for (const auto& [name, backend] : backends_) backend->OnDefaultsChanged(live.defaults);
  }
  return absl::OkStatus();
}

absl::StatusOr<WarmSandbox> SandboxService::BuildWarm(const WarmPoolConfig& config) {
  SBX_ASSIGN_OR_RETURN(runtime::Backend* backend, BackendFor(config.runtime));
  SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec tmpl, templates_.Resolve(config.template_name));
  runtime::SandboxSpec spec;
  spec.id = NewId("sbx");
  spec.tmpl = tmpl;
  spec.resources = defaults();
  spec.hostname = spec.id.substr(0, 16);
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
  return WarmSandbox{std::move(*inst), config.runtime, config.template_name, tmpl.digest,
                     spec.resources};
}

void SandboxService::ReleaseCapacity(const std::string& sandbox_id) {
  if (admission_->Release(sandbox_id)) pool_->CapacityFreed();
}

std::optional<WarmSandbox> SandboxService::TakeWarm(const CreateSandboxRequest& req,
                                                    const runtime::Resources& defaults) {
  // Pooled sandboxes have the default limits; any other request is built cold.
  if ((req.vcpu && *req.vcpu != defaults.vcpu) ||
      (req.memory_mib && *req.memory_mib != defaults.memory_mib) ||
      (req.disk_mib && *req.disk_mib != defaults.disk_mib)) {
    return std::nullopt;
  }
  auto tmpl = templates_.Resolve(req.template_ref);
  if (!tmpl.ok()) return std::nullopt;
  return pool_->Take(req.runtime.value_or(opts_.default_runtime), tmpl->name, tmpl->digest,
                     defaults);
}

bool SandboxService::ready() const {
  std::lock_guard lock(mu_);
  return ready_;
}

absl::StatusOr<runtime::Backend*> SandboxService::BackendFor(const std::string& name) const {
  auto it = backends_.find(name);
  if (it == backends_.end()) {
    std::string have;
    for (const auto& [n, b] : backends_) have += (have.empty() ? "" : ", ") + n;
    return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                    fmt::format("runtime '{}' is not available on this host (available: {})",
                                name, have),
                    "runtime");
  }
  return it->second;
}

absl::StatusOr<SandboxRecord> SandboxService::VisibleSandbox(Tx& tx, const Caller& caller,
                                                             const std::string& id) {
  if (!IsValidId(id, "sbx")) return BadId("sandbox", id);
  auto sb = tx.GetSandbox(id);
  // Another tenant's sandbox is indistinguishable from a missing one.
  if (!sb.ok() || sb->tenant_id != caller.tenant_id) return NotFound("sandbox", id);
  if (caller.initiator == "api") activity_.Touch(id);
  return sb;
}

// ---------------------------------------------------------------------------------------------
// Create

absl::StatusOr<StoredResponse> SandboxService::CreateSandbox(
    const Caller& caller, const CreateSandboxRequest& req,
    const std::optional<std::string>& idem_key) {
  static const IdemScope kScope{"POST", "/v1/sandboxes"};
  const TimePoint requested = ServiceMetrics::Clock::now();
  const std::string body_hash = Sha256Hex(req.canonical.dump());

  StoredResponse out;
  std::optional<std::pair<std::string, std::string>> submit;  // op id, sandbox id
  struct Created {
    std::string sandbox_id, state, op_id;
  };
  std::optional<Created> created;
  // Taken before the transaction, which may run more than once (busy retries); it goes back to
  // the pool unless the transaction records it.
  // One snapshot for the whole create: a reload meanwhile must not give a pooled sandbox built
  // with the old defaults the new ones' effective_resources.
  const runtime::Resources defaults = this->defaults();
  std::optional<WarmSandbox> warm = TakeWarm(req, defaults);
  bool warm_used = false;
  std::optional<OperationRecord> finished;  // the create, when the warm pool served it
  // The id this create holds capacity for; given back unless the transaction records it.
  std::optional<std::string> admitted;
  auto unadmit = [&] {
    if (admitted) ReleaseCapacity(*admitted);
    admitted.reset();
  };
  absl::Status tx_status = store_.Transact([&](Tx& tx) -> absl::Status {
    warm_used = false;
    submit.reset();
    created.reset();
    finished.reset();
    unadmit();  // an earlier attempt of this transaction (busy retry) held it under another id
    SBX_ASSIGN_OR_RETURN(auto replay, CheckIdempotency(tx, caller, idem_key, kScope, body_hash));
    if (replay) {
      out = *replay;
      return absl::OkStatus();
    }
    SBX_ASSIGN_OR_RETURN(runtime::TemplateSpec tmpl, templates_.Resolve(req.template_ref));
    const std::string runtime_name = req.runtime.value_or(opts_.default_runtime);
    SBX_RETURN_IF_ERROR(BackendFor(runtime_name).status());

    const std::string now = NowRfc3339();
    SandboxRecord sb;
    sb.id = warm ? warm->instance->id() : NewId("sbx");
    // Before anything is recorded or built. A pooled sandbox already holds its resources
    // (under the same id).
    if (!warm) {
      const Demand want{req.vcpu.value_or(defaults.vcpu), req.memory_mib.value_or(defaults.memory_mib),
                        req.disk_mib.value_or(defaults.disk_mib)};
      SBX_RETURN_IF_ERROR(admission_->Admit(sb.id, want, "the sandbox"));
      admitted = sb.id;
    }
    sb.tenant_id = caller.tenant_id;
    sb.state = std::string(kCreating);
    sb.template_ref = req.template_ref;
    sb.template_digest = tmpl.digest;
    sb.runtime = runtime_name;
    sb.resources = json::object();
    if (req.vcpu) sb.resources["vcpu"] = *req.vcpu;
    if (req.memory_mib) sb.resources["memory_mib"] = *req.memory_mib;
    if (req.disk_mib) sb.resources["disk_mib"] = *req.disk_mib;
    sb.effective_resources = EffectiveResources(req, defaults, opts_.output_buffer_bytes);
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
    OperationRecord op = NewOperation(caller.tenant_id, "create", sb.id, now);
    if (warm) {
      // Already running: the create is done in this transaction.
      sb.state = std::string(kRunning);
      sb.runtime_state = warm->instance->Persist();
      Finish(op, true, nullptr, now);
      op.result = {{"warm_pool", true}};
      warm_used = true;
      finished = op;
    } else {
      sb.current_operation_id = op.id;
      submit = {op.id, sb.id};
    }
    SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    created = Created{sb.id, sb.state, op.id};
    out.status = 202;
    out.body = json{{"sandbox", SandboxView(sb)}, {"operation", OperationView(op)}}.dump();
    SBX_RETURN_IF_ERROR(SaveIdempotency(tx, caller, idem_key, kScope, body_hash, out));
    return absl::OkStatus();
  });
  if (tx_status.ok() && created) {
    log::Context lctx;
    lctx.operation = created->op_id;
    log::Scope scope(lctx);
    LogStateChange(created->sandbox_id, "", created->state,
                   warm_used ? "from the warm pool" : std::string_view());
  }
  if (!tx_status.ok() || !created) unadmit();  // refused, failed, or a replay
  if (warm) {
    if (tx_status.ok() && warm_used) {
      metrics_->OperationFinished(*finished, requested);
      metrics_->SandboxRunning(warm->runtime, /*warm=*/true, requested);
      std::lock_guard lock(mu_);
      instances_[warm->instance->id()] = std::move(warm->instance);
    } else {
      pool_->Return(std::move(*warm));
    }
  }
  SBX_RETURN_IF_ERROR(tx_status);
  if (submit) {
    auto [op_id, sb_id] = *submit;
    engine_.Submit(sb_id, [this, op_id, sb_id, requested] { RunCreate(op_id, sb_id, requested); },
                   OperationLog(op_id, sb_id, caller.tenant_id));
  }
  return out;
}

void SandboxService::RunCreate(const std::string& op_id, const std::string& sandbox_id,
                               TimePoint requested) {
  const auto job_started = Clock::now();
  SandboxRecord sb;
  bool proceed = false;
  bool cancelled = false;
  std::optional<OperationRecord> finished;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    finished.reset();
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    SBX_ASSIGN_OR_RETURN(sb, tx.GetSandbox(sandbox_id));
    if (op.state != "pending") return absl::OkStatus();
    const std::string now = NowRfc3339();
    if (sb.state != kCreating) {
      // A delete overtook this create before it started: nothing to build.
      Finish(op, false, {{"code", "cancelled"}, {"message", "sandbox was deleted before it started"}},
             now);
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
    if (!st.ok()) spdlog::error("create {}: store: {}", sandbox_id, std::string(st.message()));
    if (st.ok() && cancelled) {
      LogOperationFinished("create", "cancelled", job_started, -1,
                           "sandbox was deleted before it started");
    }
    return;
  }
  LogOperationStarted("create");

  auto started = std::chrono::steady_clock::now();
  absl::StatusOr<runtime::InstancePtr> inst = absl::InternalError("unset");
  auto backend = BackendFor(sb.runtime);
  auto tmpl = templates_.Resolve(sb.template_ref);
  if (!backend.ok()) {
    inst = backend.status();
  } else if (!tmpl.ok()) {
    inst = tmpl.status();
  } else if (tmpl->digest != sb.template_digest) {
    inst = absl::FailedPreconditionError(
        fmt::format("template {} changed since the sandbox was requested", sb.template_ref));
  } else {
    runtime::SandboxSpec spec;
    spec.id = sb.id;
    spec.tmpl = *tmpl;
    spec.resources = ResourcesOf(sb.effective_resources, defaults());
    // The sandbox env is applied per session (CreateSession), as for pooled sandboxes.
    spec.hostname = sb.id.substr(0, 16);
    inst = (*backend)->Create(spec);
  }
  auto elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started);

  json runtime_state = inst.ok() ? (*inst)->Persist() : json(nullptr);
  // Kept before the store says running: a client that sees the operation succeed may start a
  // session at once, and must find the agent. No delete can take it meanwhile (the engine runs
  // one job per sandbox at a time); if the store fails, it is taken back and destroyed.
  const bool built = inst.ok();
  if (built) {
    std::lock_guard lock(mu_);
    instances_[sandbox_id] = std::move(*inst);
  }
  std::string from, to, result;
  st = store_.Transact([&](Tx& tx) -> absl::Status {
    finished.reset();
    SBX_ASSIGN_OR_RETURN(OperationRecord op, tx.GetOperation(op_id));
    SBX_ASSIGN_OR_RETURN(SandboxRecord cur, tx.GetSandbox(sandbox_id));
    const std::string now = NowRfc3339();
    from = cur.state;
    cur.updated_at = now;
    if (!inst.ok()) {
      json err = ErrorJson("create_failed", inst.status());
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
      Finish(op, false, {{"code", "cancelled"}, {"message", "sandbox was deleted while starting"}},
             now);
      cur.runtime_state = runtime_state;
    }
    to = cur.state;
    result = op.state == "succeeded" ? "succeeded"
             : op.error.is_object() && op.error.value("code", "") == "cancelled" ? "cancelled"
                                                                                : "failed";
    finished = op;
    SBX_RETURN_IF_ERROR(tx.PutOperation(op));
    return tx.PutSandbox(cur);
  });
  if (!st.ok()) {
    spdlog::error("create {}: store: {}", sandbox_id, std::string(st.message()));
    // Nothing runs for it any more (destroyed below, or never built).
    ReleaseCapacity(sandbox_id);
    if (built) {
      runtime::InstancePtr mine;
      {
        std::lock_guard lock(mu_);
        auto it = instances_.find(sandbox_id);
        if (it != instances_.end()) {
          mine = std::move(it->second);
          instances_.erase(it);
        }
      }
      if (mine) (void)mine->Destroy();
    }
    LogOperationFinished("create", "failed", job_started, elapsed.count(),
                         fmt::format("store: {}", std::string(st.message())));
    return;
  }
  metrics_->OperationFinished(*finished, requested);
  if (finished->state == "succeeded") {
    metrics_->SandboxRunning(sb.runtime, /*warm=*/false, requested);
  }
  // A failed build leaves nothing behind; a sandbox deleted meanwhile is released by its delete.
  if (to == kFailed) ReleaseCapacity(sandbox_id);
  LogStateChange(sandbox_id, from, to);
  LogOperationFinished("create", result, job_started, elapsed.count(),
                       inst.ok() ? std::string() : std::string(inst.status().message()));
}

// ---------------------------------------------------------------------------------------------
// Read

absl::StatusOr<SandboxRecord> SandboxService::GetSandbox(const Caller& caller,
                                                         const std::string& id) {
  SandboxRecord out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(out, VisibleSandbox(tx, caller, id));
    return absl::OkStatus();
  }));
  FillEffectiveDefaults(out, defaults(), opts_.output_buffer_bytes);
  return out;
}

absl::StatusOr<store::Page<SandboxRecord>> SandboxService::ListSandboxes(
    const Caller& caller, store::SandboxFilter filter) {
  filter.tenant_id = caller.tenant_id;
  if (filter.state && *filter.state == kDeleted) filter.include_deleted = true;
  if (filter.state && !IsSandboxState(*filter.state)) {
    return FieldError("state", fmt::format("unknown state '{}'", *filter.state));
  }
  store::Page<SandboxRecord> page;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(page, tx.ListSandboxes(filter));
    return absl::OkStatus();
  }));
  const runtime::Resources d = defaults();
  for (auto& sb : page.items) FillEffectiveDefaults(sb, d, opts_.output_buffer_bytes);
  return page;
}

absl::StatusOr<OperationRecord> SandboxService::GetOperation(const Caller& caller,
                                                             const std::string& id) {
  if (!IsValidId(id, "op")) return BadId("operation", id);
  OperationRecord out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    auto op = tx.GetOperation(id);
    if (!op.ok() || op->tenant_id != caller.tenant_id) return NotFound("operation", id);
    out = *op;
    return absl::OkStatus();
  }));
  return out;
}

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

// ---------------------------------------------------------------------------------------------
// Sessions

absl::StatusOr<StoredResponse> SandboxService::CreateSession(
    const Caller& caller, const std::string& sandbox_id, const CreateSessionRequest& req,
    const std::optional<std::string>& idem_key) {
  const IdemScope scope{"POST", "/v1/sandboxes/" + sandbox_id + "/sessions"};
  const std::string body_hash = Sha256Hex(req.canonical.dump());
  StoredResponse out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(auto replay, CheckIdempotency(tx, caller, idem_key, scope, body_hash));
    if (replay) {
      out = *replay;
      return absl::OkStatus();
    }
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, VisibleSandbox(tx, caller, sandbox_id));
    if (sb.state != kRunning) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                      fmt::format("sandbox {} is {}, not running", sb.id, sb.state));
    }
    const std::string now = NowRfc3339();
    SessionRecord s;
    s.id = NewId("ses");
    s.tenant_id = caller.tenant_id;
    s.sandbox_id = sb.id;
    s.state = "created";
    // The sandbox's env under the session's: a sandbox from the warm pool was started before
    // its env was known, so the agent's own environment cannot carry it.
    json env = sb.env.is_object() ? sb.env : json::object();
    for (const auto& [k, v] : req.env) env[k] = v;
    // The template's workdir and user are the defaults, as for the files API (the agent's
    // --workdir); a template removed since the sandbox was made leaves "/" and root.
    auto tmpl = templates_.Resolve(sb.template_ref);
    s.spec = {{"argv", req.argv},
              {"cwd", req.cwd.value_or(tmpl.ok() ? tmpl->workdir : "/")},
              {"env", env},
              {"user", req.user.value_or(tmpl.ok() ? tmpl->default_user : "root")}};
    AddInteractiveSpec(req, s.spec);
    s.created_at = now;
    SBX_RETURN_IF_ERROR(tx.PutSession(s));
    auto minted = tokens_.Mint(s.id, caller.tenant_id);
    out.status = 201;
    out.body = json{{"session_id", s.id},
                    {"sandbox_id", sb.id},
                    {"state", s.state},
                    {"attach",
                     {{"url", fmt::format("/v1/sessions/{}/attach", s.id)},
                      {"token", minted.token},
                      {"expires_at", minted.expires_at}}}}
                   .dump();
    return SaveIdempotency(tx, caller, idem_key, scope, body_hash, out);
  }));
  return out;
}

void SandboxService::AddInteractiveSpec(const CreateSessionRequest& req, json& spec) {
  // Only what was asked for: the spec of a plain session stays what it always was.
  if (req.tty) {
    spec["tty"] = json{{"rows", req.tty_rows.value_or(24)}, {"cols", req.tty_cols.value_or(80)}};
  }
  if (req.stdin_open || req.tty) spec["stdin"] = true;
  if (req.timeout_s) spec["timeout_s"] = *req.timeout_s;
  if (req.kill_grace_s) spec["kill_grace_s"] = *req.kill_grace_s;
}

absl::StatusOr<AgentClient> SandboxService::SandboxAgent(const Caller& caller,
                                                         const std::string& sandbox_id) {
  SBX_ASSIGN_OR_RETURN(SandboxRecord sb, GetSandbox(caller, sandbox_id));
  auto sock = AgentSocketFor(sb.id);
  if (!sock) {
    const std::string state = sb.state == kRunning ? "being paused" : sb.state;
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is {}, not running", sb.id, state));
  }
  return AgentClient::ForSocket(*sock);
}

absl::StatusOr<SessionRecord> SandboxService::GetSession(const Caller& caller,
                                                         const std::string& id) {
  if (!IsValidId(id, "ses")) return BadId("session", id);
  if (caller.session_scope && *caller.session_scope != id) return NotFound("session", id);
  SessionRecord out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    auto s = tx.GetSession(id);
    if (!s.ok() || s->tenant_id != caller.tenant_id) return NotFound("session", id);
    out = *s;
    if (caller.initiator == "api") activity_.Touch(s->sandbox_id);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<SandboxService::AttachTarget> SandboxService::PrepareAttach(
    const Caller& caller, const std::string& session_id) {
  SBX_ASSIGN_OR_RETURN(SessionRecord s, GetSession(caller, session_id));
  auto sock = AgentSocketFor(s.sandbox_id);
  if (!sock) {
    SandboxRecord sb;
    (void)store_.Transact([&](Tx& tx) -> absl::Status {
      auto r = tx.GetSandbox(s.sandbox_id);
      if (r.ok()) sb = *r;
      return absl::OkStatus();
    });
    if (auto lost = CheckAgentLost(s.sandbox_id)) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                      fmt::format("sandbox {} is failed: {}", s.sandbox_id, *lost));
    }
    // Running in the store but without a socket: a pause is freezing it right now.
    std::string state = sb.state.empty() ? "gone" : sb.state == kRunning ? "being paused" : sb.state;
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is {}, not running{}", s.sandbox_id, state,
                                sb.error.is_object() ? fmt::format(": {}", sb.error.value("message", "")) : ""));
  }
  // The spec as the service wrote it (CreateSession); one that no longer decodes is a store
  // that was edited by hand, and the agent would refuse it the same way.
  SBX_ASSIGN_OR_RETURN(SessionSpec spec, SessionSpec::FromJson(s.spec));
  return AttachTarget{std::move(s), AgentClient::ForSocket(*sock), std::move(spec)};
}

std::optional<AgentClient> SandboxService::AgentFor(const std::string& sandbox_id) const {
  auto sock = AgentSocketFor(sandbox_id);
  if (!sock) return std::nullopt;
  return AgentClient::ForSocket(*sock);
}

std::optional<std::string> SandboxService::AgentSocketFor(const std::string& sandbox_id) const {
  std::lock_guard lock(mu_);
  auto it = instances_.find(sandbox_id);
  // A dead agent's socket would only refuse: the caller says "not running" instead, at once.
  if (it == instances_.end() || frozen_.count(sandbox_id) || !it->second->Alive()) return std::nullopt;
  return it->second->AgentSocketPath();
}

std::optional<std::string> SandboxService::CheckAgentLost(const std::string& sandbox_id) {
  std::string reason;
  {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sandbox_id);
    if (it == instances_.end() || it->second->Alive()) return std::nullopt;
    reason = it->second->DeathReason();
  }
  const std::string message = fmt::format(
      "the sandbox's agent (PID 1) is gone ({}); the kernel ended every process of the sandbox "
      "with it, and their unread output is lost; delete the sandbox", reason);
  std::string from;
  std::vector<std::string> ended;  // sessions that were running
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    from.clear();
    ended.clear();
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, tx.GetSandbox(sandbox_id));
    // An operation in flight (a delete above all) owns the sandbox: it sees the dead agent
    // itself, and the next tick looks again once it is done.
    if (sb.current_operation_id || !(sb.state == kRunning || IsFrozenState(sb.state))) {
      return absl::OkStatus();
    }
    const std::string now = NowRfc3339();
    from = sb.state;
    sb.state = std::string(kFailed);
    sb.error = {{"code", "agent_lost"}, {"message", message}};
    sb.updated_at = now;
    SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
    SBX_ASSIGN_OR_RETURN(std::vector<SessionRecord> sessions, tx.ListSessions(sandbox_id));
    for (SessionRecord& s : sessions) {
      if (s.state == "exited") continue;
      if (s.state == "running") {
        ended.push_back(s.id);
        s.signal = "SIGKILL";  // what the kernel sends a pid namespace whose init died
      }
      s.state = "exited";
      s.exited_at = now;
      s.error = {{"code", "sandbox_failed"}, {"message", message}};
      SBX_RETURN_IF_ERROR(tx.PutSession(s));
    }
    return absl::OkStatus();
  });
  if (!st.ok()) {
    spdlog::warn("sandbox {}: agent lost, but marking it failed did not commit: {}", sandbox_id,
                 std::string(st.message()));
    return message;
  }
  if (!from.empty()) {
    {
      std::lock_guard lock(mu_);
      frozen_.erase(sandbox_id);
    }
    log::Context lctx;
    lctx.sandbox = sandbox_id;
    log::Scope scope(lctx);
    log::Event(spdlog::level::warn, {{"reason", reason}}, "sandbox {}: agent lost: {}", sandbox_id, reason);
    LogStateChange(sandbox_id, from, kFailed, message);
    for (const std::string& id : ended) metrics_->SessionExited(id, /*oom_killed=*/false);
  }
  return message;
}

bool SandboxService::HasInstance(const std::string& sandbox_id) const {
  std::lock_guard lock(mu_);
  return instances_.count(sandbox_id) > 0;
}

void SandboxService::CheckAgentsAlive() {
  std::vector<std::string> dead;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, inst] : instances_) {
      if (!inst->Alive()) dead.push_back(id);
    }
  }
  for (const std::string& id : dead) (void)CheckAgentLost(id);
}

void SandboxService::RecordSessionStarted(const std::string& session_id, bool started_now) {
  if (!started_now) return;
  bool started = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    started = false;
    SBX_ASSIGN_OR_RETURN(SessionRecord s, tx.GetSession(session_id));
    if (s.state != "created") return absl::OkStatus();
    s.state = "running";
    s.started_at = NowRfc3339();
    started = true;
    return tx.PutSession(s);
  });
  if (st.ok() && started) metrics_->SessionStarted(session_id);
  if (!st.ok()) spdlog::warn("session {}: {}", session_id, std::string(st.message()));
}

void SandboxService::RecordSessionExit(const std::string& session_id, const SessionExit& ev) {
  std::string was;  // the state this call moved the session from to exited
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    was.clear();
    SBX_ASSIGN_OR_RETURN(SessionRecord s, tx.GetSession(session_id));
    if (s.state == "exited") return absl::OkStatus();
    was = s.state;
    const std::string now = NowRfc3339();
    if (!s.started_at) s.started_at = now;
    s.state = "exited";
    s.exit_code = ev.exit_code;
    s.signal = ev.signal;
    s.timed_out = ev.timed_out;
    s.oom_killed = ev.oom_killed;
    s.exited_at = now;
    return tx.PutSession(s);
  });
  if (st.ok() && !was.empty()) {
    if (was == "created") metrics_->SessionStarted(session_id);  // its start went unrecorded
    metrics_->SessionExited(session_id, ev.oom_killed);
  }
  if (!st.ok()) spdlog::warn("session {}: {}", session_id, std::string(st.message()));
}

void SandboxService::RecordSessionStatus(const std::string& session_id,
                                         const SessionStatus& status) {
  const std::string& state = status.state;
  if (state != "running" && state != "exited") return;
  std::string was;  // the state this call moved the session from
  bool oom_killed = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    was.clear();
    SBX_ASSIGN_OR_RETURN(SessionRecord s, tx.GetSession(session_id));
    if (s.state == "exited" || s.state == state) return absl::OkStatus();
    was = s.state;
    s.state = state;
    if (status.started_at) s.started_at = *status.started_at;
    if (state == "exited") {
      if (status.exit_code) s.exit_code = *status.exit_code;
      if (status.signal) s.signal = *status.signal;
      s.oom_killed = status.oom_killed;
      s.timed_out = status.timed_out;
      s.exited_at = status.exited_at.value_or(NowRfc3339());
    }
    oom_killed = s.oom_killed;
    return tx.PutSession(s);
  });
  if (st.ok() && !was.empty()) {
    if (was == "created") metrics_->SessionStarted(session_id);
    if (state == "exited") metrics_->SessionExited(session_id, oom_killed);
  }
  if (!st.ok()) spdlog::warn("session {}: {}", session_id, std::string(st.message()));
}

// ---------------------------------------------------------------------------------------------
// Start-up

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
    auto backend = BackendFor(sb.runtime);
    const bool alive = sb.state == kRunning || IsFrozenState(sb.state);
    if (alive && backend.ok()) {
      auto inst = (*backend)->Adopt(sb.id, sb.runtime_state);
      if (inst.ok()) {
        // The kernel knows whether the sandbox is frozen; the store may not (a pause, suspend
        // or wake interrupted by the restart is failed below).
        bool interrupted = false;
        if (sb.current_operation_id) {
          for (const auto& op : unfinished) {
            if (op.id == *sb.current_operation_id &&
                (op.kind == "pause" || op.kind == "suspend" || op.kind == "wake")) {
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
        adopted.push_back(sb.id);
        // What it was denied before the restart was counted by the previous process.
        if (auto n = (*inst)->DeniedEgress(); n.ok()) {
          metrics_->EgressReading(sb.id, *n, /*baseline=*/true);
        }
        std::lock_guard lock(mu_);
        instances_[sb.id] = std::move(*inst);
        if (IsFrozenState(state)) frozen_.insert(sb.id);
        continue;
      }
      spdlog::warn("sandbox {} could not be re-adopted: {}", sb.id,
                   std::string(inst.status().message()));
      sb.error = {{"code", "sandbox_lost"},
                  {"message", fmt::format("lost across an sbxd restart: {}",
                                          std::string(inst.status().message()))}};
    } else if (alive) {
      sb.error = {{"code", "sandbox_lost"},
                  {"message", fmt::format("runtime {} is not available", sb.runtime)}};
    } else if (sb.state == kCreating) {
      sb.error = {{"code", "create_failed"},
                  {"message", "sbxd restarted while the sandbox was being created"}};
    } else if (sb.state == kDeleting && sb.current_operation_id) {
      redrive_deletes.push_back(Redrive{*sb.current_operation_id, sb.id, sb.tenant_id});
      continue;
    } else {
      continue;  // failed sandboxes stay as they are until deleted
    }
    const std::string from = sb.state;
    sb.state = std::string(kFailed);
    sb.current_operation_id.reset();
    sb.updated_at = NowRfc3339();
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) { return tx.PutSandbox(sb); }));
    LogStateChange(sb.id, from, kFailed, sb.error.value("message", ""));
  }

  // Operations a crash interrupted (other than the deletes re-driven below) failed.
  std::set<std::string> redriven;
  for (const auto& r : redrive_deletes) redriven.insert(r.op_id);
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
  if (listed.ok()) {
    for (const std::string& id : running_sessions) {
      metrics_->SessionStarted(id, /*count_start=*/false);
    }
  } else {
    spdlog::warn("sbx_sessions_active starts without the sessions of re-adopted sandboxes: {}",
                 std::string(listed.message()));
  }

  // The ledger, from the states just settled: what the store says each sandbox holds.
  {
    const runtime::Resources d = defaults();
    int64_t held = 0;
    for (const SandboxRecord& sb : live) {
      if (!HoldsResources(sb)) continue;
      admission_->Hold(sb.id, DemandOf(ResourcesOf(sb.effective_resources, d)));
      ++held;
    }
    if (held > 0) spdlog::info("admission: {} sandboxes hold resources after the restart", held);
  }

  for (const auto& [name, backend] : backends_) {
    absl::Status st = backend->Sweep(known[name]);
    if (!st.ok()) {
      spdlog::warn("sweep of runtime {}: {}", name, std::string(st.message()));
    }
  }
  for (const auto& r : redrive_deletes) {
    std::string op = r.op_id, id = r.sandbox_id;
    const TimePoint requested = ServiceMetrics::Clock::now();
    engine_.Submit(id, [this, op, id, requested] { RunDelete(op, id, requested); },
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

}  // namespace sbx::service
