#include "service/sandbox_service.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "service/service_internal.h"
#include "service/sandbox_state.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

SandboxService::SandboxService(ServiceOptions opts, store::Store& store,
                               ops::OperationEngine& engine, TemplateRegistry templates,
                               std::map<std::string, runtime::Backend*> backends)
    : opts_(std::move(opts)),
      store_(store),
      engine_(engine),
      templates_(std::move(templates)),
      backends_(std::move(backends)),
      tokens_(opts_.attach_keys, opts_.attach_keys_file, opts_.attach_token_ttl),
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

namespace {

// The `egress` label of the warm pool gauges.
std::string EgressLabel(const WarmPool::PoolStats& p) { return p.networked ? "networked" : "none"; }

}  // namespace

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
      "sbx_warm_pool_ready", "Sandboxes ready in the warm pool, by runtime, template and egress (none, or networked: "
      "network-ready members).",
      metrics::Type::kGauge, {"runtime", "template", "egress"}, [this](metrics::CallbackSamples& out) {
        for (const auto& p : pool_->Stats()) out.Add({p.runtime, p.template_name, EgressLabel(p)}, p.ready);
      }));
  metric_callbacks_.push_back(registry.AddCallback(
      "sbx_warm_pool_target",
      "The number of sandboxes the warm pool keeps ready, by runtime, template and egress.",
      metrics::Type::kGauge, {"runtime", "template", "egress"}, [this](metrics::CallbackSamples& out) {
        for (const auto& p : pool_->Stats()) out.Add({p.runtime, p.template_name, EgressLabel(p)}, p.target);
      }));
}

void SandboxService::StartWarmPools() {
  if (!ready()) {
    spdlog::error("warm pools not started: the service has not reconciled yet");
    return;
  }
  pool_->Start();
}

bool SandboxService::ready() const {
  std::lock_guard lock(mu_);
  return ready_;
}

absl::StatusOr<runtime::Backend*> SandboxService::BackendFor(const std::string& name) const {
  auto it = backends_.find(name);
  if (it == backends_.end()) {
    if (auto u = opts_.unavailable_runtimes.find(name); u != opts_.unavailable_runtimes.end()) {
      return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                      fmt::format("runtime '{}' is not available on this host: {}", name, u->second),
                      "runtime");
    }
    std::string have;
    for (const auto& [n, b] : backends_) have += (have.empty() ? "" : ", ") + n;
    // A runtime sbx has, which this sbxd does not run, is the host's lack (501); any other
    // name is the client's mistake, not a feature missing here.
    constexpr std::string_view kRuntimes[] = {"ns", "microvm", "fake"};
    if (std::find(std::begin(kRuntimes), std::end(kRuntimes), name) == std::end(kRuntimes)) {
      return FieldError("runtime", fmt::format("'{}' is not a runtime (runtimes: ns, microvm; on "
                                               "this host: {})",
                                               name, have));
    }
    return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                    fmt::format("runtime '{}' is not available on this host (available: {})",
                                name, have),
                    "runtime");
  }
  return it->second;
}

std::string SandboxService::BuildRuntime() const {
  auto can_build = [&](const std::string& name) {
    auto it = backends_.find(name);
    return it != backends_.end() && it->second->GetCapabilities().template_builds;
  };
  if (can_build(opts_.default_runtime) || !can_build("ns")) return opts_.default_runtime;
  return "ns";
}

nlohmann::json SandboxService::Runtimes() const {
  std::set<std::string> names;
  for (const auto& [n, b] : backends_) names.insert(n);
  for (const auto& [n, why] : opts_.unavailable_runtimes) names.insert(n);
  nlohmann::json out = nlohmann::json::array();
  const nlohmann::json defaults = EffectiveResources(this->defaults(), opts_.output_buffer_bytes);
  for (const auto& n : names) {
    nlohmann::json r = {{"name", n}, {"default", n == opts_.default_runtime}};
    auto it = backends_.find(n);
    if (it == backends_.end()) {
      r["available"] = false;
      r["reason"] = opts_.unavailable_runtimes.at(n);
      r["capabilities"] = nullptr;
      r["defaults"] = nullptr;
      r["details"] = nlohmann::json::object();
    } else {
      const runtime::Capabilities c = it->second->GetCapabilities();
      r["available"] = true;
      r["reason"] = nullptr;
      r["capabilities"] = {{"pause", c.pause},
                           {"suspend_releases_memory", c.suspend_releases_memory},
                           {"snapshots", c.snapshots},
                           {"egress_policy", c.egress_policy},
                           {"warm_pool_networked", c.network_ready},
                           {"template_builds", c.template_builds}};
      r["defaults"] = defaults;
      r["details"] = it->second->Describe();
    }
    out.push_back(std::move(r));
  }
  return {{"runtimes", std::move(out)}};
}

absl::StatusOr<SandboxRecord> SandboxService::VisibleSandbox(Tx& tx, const Caller& caller,
                                                             const std::string& id) {
  if (!IsValidId(id, "sbx")) return BadId("sandbox", id);
  // Another tenant's sandbox is indistinguishable from a missing one.
  SBX_ASSIGN_OR_RETURN(SandboxRecord sb,
                       VisibleRow(tx.GetSandbox(id), [&](const SandboxRecord& r) {
                         return r.tenant_id == caller.tenant_id;
                       }, "sandbox", id));
  if (caller.initiator == "api") activity_.Touch(id);
  return sb;
}

absl::StatusOr<store::SandboxAndTenant> SandboxService::VisibleSandboxAndTenant(
    Tx& tx, const Caller& caller, const std::string& id) {
  if (!IsValidId(id, "sbx")) return BadId("sandbox", id);
  // As VisibleSandbox: another tenant's sandbox (and so its tenant's row) is never seen.
  auto mine = [&](const store::SandboxAndTenant& r) {
    return r.sandbox.tenant_id == caller.tenant_id;
  };
  SBX_ASSIGN_OR_RETURN(store::SandboxAndTenant both,
                       VisibleRow(tx.GetSandboxAndTenant(id), mine, "sandbox", id));
  if (caller.initiator == "api") activity_.Touch(id);
  return both;
}

// ---------------------------------------------------------------------------------------------
// Read

absl::StatusOr<SandboxRecord> SandboxService::GetSandbox(const Caller& caller,
                                                         const std::string& id) {
  SandboxRecord out;
  SBX_RETURN_IF_ERROR(store_.Read([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(out, VisibleSandbox(tx, caller, id));
    return absl::OkStatus();
  }));
  FillEffectiveDefaults(out, defaults(), opts_.output_buffer_bytes);
  return out;
}

absl::Status SandboxService::ExpiredError(const Caller& caller, const std::string& id) {
  std::optional<OperationRecord> ttl_delete;
  SandboxRecord sb;
  (void)store_.Transact([&](Tx& tx) -> absl::Status {
    ttl_delete.reset();
    std::string sandbox_id = id;
    if (IsValidId(id, "ses")) {
      SBX_ASSIGN_OR_RETURN(store::SessionRecord s, tx.GetSession(id));
      if (s.tenant_id != caller.tenant_id) return absl::OkStatus();
      sandbox_id = s.sandbox_id;
    } else if (!IsValidId(id, "sbx")) {
      return absl::OkStatus();
    }
    SBX_ASSIGN_OR_RETURN(sb, tx.GetSandbox(sandbox_id));
    if (sb.tenant_id != caller.tenant_id || sb.state != kDeleted) return absl::OkStatus();
    SBX_ASSIGN_OR_RETURN(auto ops, tx.ListOperations(sb.id));
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      if (it->kind == "delete") {
        if (it->initiator == "ttl") ttl_delete = *it;
        break;
      }
    }
    return absl::OkStatus();
  });
  if (!ttl_delete) return absl::OkStatus();
  const std::string at = ttl_delete->completed_at.value_or(ttl_delete->created_at);
  absl::Status s = ApiError(
      absl::StatusCode::kFailedPrecondition, "sandbox_expired",
      fmt::format("sandbox {} expired at {}: its timeout_s of {} s from its creation at {} ran "
                  "out, and it was deleted (a longer timeout_s at create keeps a sandbox)",
                  sb.id, at, sb.timeout_s.value_or(0), sb.created_at));
  s = WithDetail(std::move(s), "expired_at", at);
  return WithDetail(std::move(s), "reason", "timeout");
}

absl::StatusOr<store::Page<SandboxRecord>> SandboxService::ListSandboxes(
    const Caller& caller, store::SandboxFilter filter) {
  filter.tenant_id = caller.tenant_id;
  if (filter.state && *filter.state == kDeleted) filter.include_deleted = true;
  if (filter.state && !IsSandboxState(*filter.state)) {
    return FieldError("state", fmt::format("unknown state '{}'", *filter.state));
  }
  store::Page<SandboxRecord> page;
  SBX_RETURN_IF_ERROR(store_.Read([&](Tx& tx) -> absl::Status {
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
  SBX_RETURN_IF_ERROR(store_.Read([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(out, VisibleRow(tx.GetOperation(id), [&](const OperationRecord& r) {
                           return r.tenant_id == caller.tenant_id;
                         }, "operation", id));
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace sbx::service
