#include "service/views.h"

#include "common/time_util.h"

namespace sbx::service {
namespace {
template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace

nlohmann::json ExpiresAt(const store::SandboxRecord& r) {
  if (!r.timeout_s) return nullptr;
  auto created = ParseRfc3339(r.created_at);
  if (!created) return nullptr;
  return FormatRfc3339(*created + std::chrono::seconds(*r.timeout_s));
}

nlohmann::json SandboxView(const store::SandboxRecord& r) {
  nlohmann::json requested = {{"vcpu", nullptr}, {"memory_mib", nullptr}, {"disk_mib", nullptr}};
  for (const char* k : {"vcpu", "memory_mib", "disk_mib"}) {
    if (r.resources.is_object() && r.resources.contains(k)) requested[k] = r.resources[k];
  }
  return {
      {"id", r.id},
      {"tenant_id", r.tenant_id},
      {"state", r.state},
      {"template", r.template_ref},
      {"template_digest", r.template_digest},
      {"runtime", r.runtime},
      // Which node holds it (docs/scale.md); null for a row no node has claimed yet.
      {"node", r.node.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.node)},
      {"resources", requested},
      {"effective_resources", r.effective_resources},
      {"egress_profile", r.egress_profile},
      {"env", r.env.is_object() ? r.env : nlohmann::json::object()},
      {"labels", r.labels.is_object() ? r.labels : nlohmann::json::object()},
      {"timeout_s", OrNull(r.timeout_s)},
      {"expires_at", ExpiresAt(r)},
      {"idle_suspend_s", OrNull(r.idle_suspend_s)},
      {"created_at", r.created_at},
      {"updated_at", r.updated_at},
      {"current_operation_id", OrNull(r.current_operation_id)},
      {"error", r.error},
      // Only the owner sees a sandbox: its traffic token is the owner's to hand out.
      {"traffic_token", r.port_access.is_object() ? r.port_access.value("traffic_token", nlohmann::json(nullptr)) : nlohmann::json(nullptr)},
      {"public_ports", r.port_access.is_object() && r.port_access.value("public", false)},
  };
}

nlohmann::json OperationView(const store::OperationRecord& r) {
  nlohmann::json out = {
      {"id", r.id},
      {"kind", r.kind},
      {"sandbox_id", r.sandbox_id},
      {"state", r.state},
      {"error", r.error},
      {"result", r.result},
      {"created_at", r.created_at},
      {"updated_at", r.updated_at},
      {"completed_at", OrNull(r.completed_at)},
      {"initiator", r.initiator},
  };
  // A template operation has no sandbox: it names the template it makes and how far it is.
  if (r.sandbox_id.empty()) {
    out["sandbox_id"] = nullptr;
    out["target"] = r.target;
    out["progress"] = r.progress;
  }
  return out;
}

nlohmann::json SessionView(const store::SessionRecord& r) {
  const auto& spec = r.spec;
  return {
      {"id", r.id},
      {"sandbox_id", r.sandbox_id},
      {"state", r.state},
      {"argv", spec.value("argv", nlohmann::json::array())},
      {"cwd", spec.value("cwd", "/")},
      {"user", spec.value("user", "root")},
      {"exit_code", OrNull(r.exit_code)},
      {"signal", OrNull(r.signal)},
      {"timed_out", r.timed_out},
      {"oom_killed", r.oom_killed},
      {"created_at", r.created_at},
      {"started_at", OrNull(r.started_at)},
      {"exited_at", OrNull(r.exited_at)},
      {"error", r.error},
      {"tty", spec.value("tty", nlohmann::json())},
      {"stdin", spec.value("stdin", false)},
      {"timeout_s", spec.value("timeout_s", nlohmann::json())},
  };
}

}  // namespace sbx::service
