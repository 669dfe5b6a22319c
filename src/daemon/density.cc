// Density at start-up: the descriptors sbxd may hold, and how many sandboxes this host's limits
// hold (runtime/doctor/density.h).
#include "daemon/density.h"

#include <sys/resource.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "runtime/doctor/density.h"
#include "runtime/ns/userns.h"

namespace sbx::daemon {

// Descriptors are sbxd's first limit on density (one pidfd per sandbox, beside the
// connections): the soft limit goes up to the hard one, which needs no privilege. Before
// CheckSettings, whose derived connection caps read the soft limit.
void RaiseOpenFiles(const absl::StatusOr<int>& inherited) {
  if (!inherited.ok()) {
    spdlog::warn("density: {}; descriptors inherited from the parent stay open",
                 std::string(inherited.status().message()));
  } else if (*inherited > 0) {
    spdlog::info("closed {} descriptor(s) inherited from the parent", *inherited);
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("density: getrlimit(RLIMIT_NOFILE): {}", ErrnoMessage(errno));
    return;
  }
  if (rl.rlim_cur == rl.rlim_max) return;
  const rlim_t before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("density: setrlimit(RLIMIT_NOFILE, {}): {}; keeping {}",
                 static_cast<uint64_t>(rl.rlim_max), ErrnoMessage(errno),
                 static_cast<uint64_t>(before));
    return;
  }
  spdlog::info("density: raised the soft RLIMIT_NOFILE from {} to the hard limit {}",
               static_cast<uint64_t>(before), static_cast<uint64_t>(rl.rlim_max));
}

// How many sandboxes the host's limits hold (runtime/doctor/density.h): the cap of
// admission.max_sandboxes 0, and the refusal of an explicit maximum they cannot hold, instead
// of launches failing midway at EMFILE, EAGAIN or ENOSPC.
absl::StatusOr<int64_t> ResolveDensity(const Config& cfg, int64_t held_fds) {
  namespace doctor = runtime::doctor;
  SBX_ASSIGN_OR_RETURN(doctor::HostLimits host, doctor::ReadHostLimits());
  doctor::DensityInputs in;
  in.max_sandboxes = cfg.admission.max_sandboxes;
  in.ns = cfg.runtime.default_runtime == "ns";
  in.user_namespaces = cfg.runtime.ns.user_namespaces;
  if (in.ns) {
    in.pooled = cfg.runtime.ns.netns_pool + cfg.runtime.ns.userns_pool + cfg.runtime.ns.disk_pool +
                cfg.runtime.ns.cgroup_pool;
  }
  in.held_fds = held_fds;
  in.uid_ranges = (runtime::ns::kUidRangeEnd - runtime::ns::kUidRangeFirst) /
                  runtime::ns::kUidRangeSize;
  const doctor::DensityPlan plan = doctor::PlanDensity(host, in);
  if (!plan.Short().empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "{}: this host's limits hold {} sandboxes: {} (`sbx doctor --max-sandboxes {}` lists "
        "them)",
        Describe(cfg, "admission.max_sandboxes"), plan.host_holds,
        doctor::DescribeShort(plan), plan.max_sandboxes));
  }
  int64_t memory_holds = -1;
  for (const doctor::LimitRow& r : plan.rows) {
    if (r.id != "limits.kernel_memory") continue;
    memory_holds = r.holds;
    // An explicit maximum past it is the operator's call, but not a silent one.
    if (cfg.admission.max_sandboxes > 0 && r.need > r.have) {
      spdlog::warn("density: {} sandboxes would take ~{} MiB of kernel memory, more than {}% of "
                   "MemTotal ({} MiB): it grows as the square of the count; about {} fit",
                   plan.max_sandboxes, r.need, doctor::kKernelMemoryWarnPercent, r.have, r.holds);
    }
  }
  spdlog::info("density: this host's limits hold {} sandboxes (set by {}); at most {} at once{}{}",
               plan.host_holds, plan.bottleneck, plan.max_sandboxes,
               cfg.admission.max_sandboxes == 0 ? " (admission.max_sandboxes 0: all of them)" : "",
               memory_holds >= 0 ? fmt::format("; the kernel memory of about {} idle ones stays "
                                               "under {}% of MemTotal", memory_holds,
                                               doctor::kKernelMemoryWarnPercent)
                                 : std::string());
  return plan.host_holds;
}

}  // namespace sbx::daemon
