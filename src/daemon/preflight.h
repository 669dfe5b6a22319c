// sbxd's host preflight: `sbxd --check [--json]` and the start-up gate. Both run the doctor
// (runtime/doctor/doctor.h) with sbxd's own options, so what `sbx doctor` reports is what sbxd
// would refuse on.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "runtime/doctor/doctor.h"
#include "service/templates.h"

namespace sbx::daemon {

struct PreflightConfig {
  std::string state_dir;
  std::string runtime;
  std::string agent_path;
  bool user_namespaces = true;
  std::string seccomp_policy_path;
  std::string cgroup_parent;
  int64_t max_sandboxes = 0;  // admission.max_sandboxes: the limits.* rows of --check
  int64_t pooled = 0;         // what the ns pools hold beside the sandboxes
  std::string microvm_qemu;   // runtime.microvm.qemu / .kernel: the microvm.* rows
  std::string microvm_kernel;
  std::string microvm_vmm = "qemu";  // runtime.microvm.vmm / .firecracker / .jailer
  std::string microvm_firecracker = "firecracker";
  std::string microvm_jailer = "jailer";
};

// `sbxd --check`: every row, printed as a table (color on a tty) or as JSON on stdout. Touches
// nothing (a state dir that does not exist is not created). Returns the exit code: 0 when no
// required check failed, 1 otherwise.
int RunCheckCommand(const PreflightConfig& config, bool json);

// Start-up: only the rows the runtime requires, with `base` from the registry sbxd just built.
// On failure prints the failing rows and their remedies to stderr and returns
// FailedPrecondition naming them; logs how long it took either way.
absl::Status StartupPreflight(const PreflightConfig& config,
                              const service::TemplateRegistry& templates);

}  // namespace sbx::daemon
