#include "daemon/runtime_options.h"

namespace sbx::daemon {

runtime::ns::NsOptions NsOptionsOf(const Config& c, const std::string& agent_path) {
  const auto& ns = c.runtime.ns;
  runtime::ns::NsOptions o;
  o.state_dir = c.state.dir;
  o.agent_path = agent_path;
  o.agent_buffer_bytes = static_cast<size_t>(c.sessions.output_buffer_bytes);
  o.cgroup_favor_dynmods = ns.cgroup_favor_dynmods;
  o.cgroup_parent = ns.cgroup_parent;
  o.netns_pool_size = static_cast<int>(ns.netns_pool);
  o.disk_pool_size = static_cast<int>(ns.disk_pool);
  o.cgroup_pool_size = static_cast<int>(ns.cgroup_pool);
  o.disk_pool_mib = static_cast<int>(c.sandbox.defaults.disk_mib);
  o.removal_backlog = static_cast<size_t>(ns.removal_backlog);
  o.user_namespaces = ns.user_namespaces;
  o.userns_pool_size = static_cast<int>(ns.userns_pool);
  o.seccomp_policy_path = ns.seccomp_policy;
  o.agent_memory_mib = static_cast<int>(ns.agent_memory_mib);
  o.agent_pids = static_cast<int>(ns.agent_pids);
  return o;
}

runtime::microvm::MicrovmOptions MicrovmOptionsOf(const Config& c, const std::string& agent_path) {
  runtime::microvm::MicrovmOptions o;
  o.state_dir = c.state.dir;
  o.agent_path = agent_path;
  o.vmm = c.runtime.microvm.vmm;
  o.qemu = c.runtime.microvm.qemu;
  o.firecracker = c.runtime.microvm.firecracker;
  o.jailer = c.runtime.microvm.jailer;
  o.kernel = c.runtime.microvm.kernel;
  o.accel = c.runtime.microvm.accel;
  o.boot_timeout_s = static_cast<int>(c.runtime.microvm.boot_timeout_s);
  o.agent_buffer_bytes = static_cast<size_t>(c.sessions.output_buffer_bytes);
  return o;
}

}  // namespace sbx::daemon
