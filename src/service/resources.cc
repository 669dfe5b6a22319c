#include <fmt/format.h>

#include <utility>

#include "common/status_util.h"
#include "service/service_internal.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

namespace internal {
namespace {

// The stored form of runtime::Resources: one key of effective_resources per field.
constexpr std::pair<const char*, int64_t runtime::Resources::*> kStoredFields[] = {
    {"vcpu", &runtime::Resources::vcpu},
    {"memory_mib", &runtime::Resources::memory_mib},
    {"disk_mib", &runtime::Resources::disk_mib},
    {"pids", &runtime::Resources::pids},
    {"open_files", &runtime::Resources::open_files},
    {"tmp_mib", &runtime::Resources::tmp_mib},
    {"shm_mib", &runtime::Resources::shm_mib},
};

}  // namespace

runtime::Resources EffectiveOf(const CreateSandboxRequest& req, runtime::Resources defaults) {
  defaults.vcpu = req.vcpu.value_or(defaults.vcpu);
  defaults.memory_mib = req.memory_mib.value_or(defaults.memory_mib);
  defaults.disk_mib = req.disk_mib.value_or(defaults.disk_mib);
  return defaults;
}

json RequestedResources(const CreateSandboxRequest& req) {
  json out = json::object();
  if (req.vcpu) out["vcpu"] = *req.vcpu;
  if (req.memory_mib) out["memory_mib"] = *req.memory_mib;
  if (req.disk_mib) out["disk_mib"] = *req.disk_mib;
  return out;
}

json EffectiveResources(const runtime::Resources& r, int64_t output_buffer_bytes) {
  json out = json::object();
  for (const auto& [key, field] : kStoredFields) out[key] = r.*field;
  out["output_buffer_bytes"] = output_buffer_bytes;
  return out;
}

runtime::Resources ResourcesOf(const json& eff, const runtime::Resources& d) {
  runtime::Resources r = d;
  if (!eff.is_object()) return r;
  for (const auto& [key, field] : kStoredFields) {
    auto it = eff.find(key);
    if (it != eff.end() && it->is_number_integer()) r.*field = it->get<int64_t>();
  }
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
  json eff = sb.effective_resources.is_object() ? sb.effective_resources : json::object();
  const json filled = EffectiveResources(ResourcesOf(eff, defaults), output_buffer_bytes);
  for (const auto& [k, v] : filled.items()) {
    if (!eff.contains(k)) eff[k] = v;
  }
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
