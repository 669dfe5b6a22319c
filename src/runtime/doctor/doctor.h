// Host preflight (`sbx doctor`, `sbxd --check`, and sbxd's start-up gate): one row per kernel
// or host feature the runtimes depend on, each saying what was found and, when it is not ok,
// what to do. Most failures users meet are host problems; a row that names the missing
// controller or the errno of a refused unshare beats a failed create.
//
// One kernel concern per file: kernel.cc, namespaces.cc, cgroups.cc, filesystems.cc,
// security.cc (privileges, capabilities, seccomp, Landlock), network.cc (veth, nftables),
// devices.cc (loop, kvm), storage.cc (state dir, space, disk caps), install.cc (sbx's own
// pieces: agent binary, base template). docs/doctor.md lists every check id.
//
// Nothing here throws or aborts: every failure is a row. Probes that could block (anything in a
// child process) run under a timeout, and the child is SIGKILLed when it passes.
//
// Probes that fork (namespaces, seccomp install, veth/nftables, kvm) must run before the
// calling process starts threads, or with `only_required`: it skips the network and kvm
// children, the only ones that allocate after fork.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace sbx::runtime::doctor {

enum class CheckResult { kOk, kWarn, kFail, kSkip };

// "ok", "warn", "fail", "skip" (the JSON spelling).
const char* ResultName(CheckResult r);

struct Check {
  std::string id;     // "cgroup.memory"
  std::string title;  // "memory controller"
  CheckResult result = CheckResult::kSkip;
  std::string detail;  // what was found
  std::string remedy;  // what to do; empty when ok
  // For the selected runtime: a failure means it cannot work here. A row that is not required
  // is never kFail: its problems are warnings.
  bool required = false;
};

struct DoctorOptions {
  // Where file-based probes read (<root>/proc/..., <root>/sys/...). Not "/" means a fake host
  // (tests): syscall probes are then not run and report kSkip.
  std::string host_root = "/";
  std::string state_dir = "/var/lib/sbx";
  std::string runtime = "ns";  // "ns" or "fake": decides which rows are required
  std::string agent_path;      // the sbx-agent binary sbxd would use
  bool user_namespaces = true;  // sbxd --userns: idmapped mounts and user namespaces needed
  std::string seccomp_policy_path;  // empty: the policy embedded at build time
  std::string cgroup_parent;        // runtime.ns.cgroup_parent; empty: <own cgroup>/sbx
  std::string microvm_qemu;         // runtime.microvm.qemu; empty: qemu-system-x86_64
  std::string microvm_kernel;       // runtime.microvm.kernel; empty: the newest /boot/vmlinuz-*
  // runtime.microvm.vmm ("qemu" or "firecracker") and Firecracker's binaries (names on PATH or
  // paths): with "firecracker" the microvm.firecracker row replaces microvm.qemu, and KVM that
  // runs stock guests becomes required (Firecracker has no software emulation).
  std::string microvm_vmm = "qemu";
  std::string microvm_firecracker = "firecracker";
  std::string microvm_jailer = "jailer";
  // Resolves the `base` template (the caller owns the template code: sbxd, sbx). Unset: the
  // row reports kSkip.
  std::function<absl::Status()> template_check;
  // Syscall probes (unshare, idmap, seccomp install, loop, kvm, statvfs...). Forced off when
  // host_root is not "/".
  bool live = true;
  // sbxd's start-up gate: only the rows required for `runtime`, so that optional probes (veth,
  // nftables, kvm) cost nothing there.
  bool only_required = false;
  // Also sbxd's start-up: leave out the probes the ns backend repeats right after with the same
  // message (the agent's sealed-memfd load, the idmap probe, DiskProvider::Probe); their rows
  // report kSkip, or the file-level checks only.
  bool skip_backend_probes = false;
  // Bound on each child process a probe runs; the child is killed when it passes.
  std::chrono::milliseconds probe_timeout{5000};
  // The `limits.*` rows (density.h): the sandboxes the host must hold (0: report what it
  // holds), what the pools hold beside them, and sbxd's descriptors besides sandboxes (0:
  // what sbxd's default connection caps take under this process's RLIMIT_NOFILE).
  int64_t max_sandboxes = 0;
  int64_t pooled = 0;
  int64_t held_fds = 0;
};

struct Report {
  std::vector<Check> checks;
  // No required check failed.
  bool ok() const;
  // nullptr when no row has this id.
  const Check* Find(const std::string& id) const;
  // The rows that make ok() false.
  std::vector<Check> RequiredFailures() const;
};

Report RunDoctor(const DoctorOptions& options);

// Aligned columns "check | result | detail / what to do", one row per check, the remedy on the
// line below its detail, then (with `verdict`) a one-line summary. `color`: ANSI colors (callers
// pass isatty). `width` > 0 wraps the last column at that many characters; 0 never wraps.
std::string FormatTable(const Report& report, bool color, int width = 0, bool verdict = true);

// {"ok": bool, "checks": [{"id", "title", "result", "detail", "remedy", "required"}]}
nlohmann::json ToJson(const Report& report);

}  // namespace sbx::runtime::doctor
