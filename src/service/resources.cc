#include <fmt/format.h>

#include "common/status_util.h"
#include "service/service_internal.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

namespace internal {
namespace {

int IntOr(const json& eff, const char* key, int fallback) {
  if (!eff.is_object()) return fallback;
  auto it = eff.find(key);
  return it != eff.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

}  // namespace

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

}  // namespace internal

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

void SandboxService::ReleaseCapacity(const std::string& sandbox_id) {
  if (admission_->Release(sandbox_id)) pool_->CapacityFreed();
}

}  // namespace sbx::service
