#include "runtime/doctor/density.h"

#include <sys/stat.h>

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/doctor/checks.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::doctor {
namespace {

constexpr const char* kNamespaceTypes[] = {"mnt", "pid", "net", "ipc", "uts", "cgroup", "time",
                                           "user"};

std::string Under(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  return root + path;
}

int64_t ReadNumber(const std::string& path) {
  auto text = ns::ReadFileToString(path);
  if (!text.ok()) return -1;
  return std::strtoll(text->c_str(), nullptr, 10);
}

int64_t CeilDiv(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

// Sandboxes a limit holds when each takes `per` of it beside `fixed` (never below 0).
int64_t Holds(int64_t have, int64_t fixed, int64_t per) {
  if (have < 0) return INT64_MAX;  // unread: not what stops anything
  return std::max<int64_t>(0, (have - fixed) / per);
}

// A sysctl value with room: the need rounded up to a multiple of 1024.
int64_t Roomy(int64_t need) { return CeilDiv(need, 1024) * 1024; }

}  // namespace

absl::StatusOr<HostLimits> ReadHostLimits(const std::string& host_root) {
  HostLimits h;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    return ErrnoStatus(errno, "density: getrlimit(RLIMIT_NOFILE)");
  }
  auto clamp = [](rlim_t v) {
    return v == RLIM_INFINITY ? int64_t{1} << 30 : static_cast<int64_t>(v);
  };
  h.nofile_soft = clamp(rl.rlim_cur);
  h.nofile_hard = clamp(rl.rlim_max);
  h.pid_max = ReadNumber(Under(host_root, "/proc/sys/kernel/pid_max"));
  h.threads_max = ReadNumber(Under(host_root, "/proc/sys/kernel/threads-max"));
  for (const char* type : kNamespaceTypes) {
    h.max_namespaces.emplace_back(
        type, ReadNumber(Under(host_root, fmt::format("/proc/sys/user/max_{}_namespaces", type))));
  }
  auto meminfo = ns::ReadFileToString(Under(host_root, "/proc/meminfo"));
  if (meminfo.ok()) {
    if (auto at = meminfo->find("MemTotal:"); at != std::string::npos) {
      h.mem_total_mib = std::strtoll(meminfo->c_str() + at + 9, nullptr, 10) / 1024;
    }
  }
  std::error_code ec;
  int64_t nodes = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(Under(host_root, "/sys/devices/system/node"), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) == 0 && name.size() > 4 &&
        std::isdigit(static_cast<unsigned char>(name[4]))) {
      ++nodes;
    }
  }
  h.numa_nodes = std::max<int64_t>(1, nodes);
  // The memory controller on cgroup v1 (a hybrid host): the agent shares its sandbox's memcg.
  struct stat st;
  if (::stat(Under(host_root, "/sys/fs/cgroup/memory/memory.limit_in_bytes").c_str(), &st) == 0) {
    h.memcgs_per_sandbox = kMemcgsPerSandboxV1;
  }
  return h;
}

int64_t ShrinkerMapBytes(int64_t n, int64_t numa_nodes, int64_t memcgs_per_sandbox) {
  const int64_t memcgs = n * memcgs_per_sandbox;
  const int64_t units = CeilDiv(n * kSuperblocksPerSandbox, kShrinkersPerUnit);
  return memcgs * units * kShrinkerUnitBytes * std::max<int64_t>(1, numa_nodes);
}

std::vector<const LimitRow*> DensityPlan::Short() const {
  std::vector<const LimitRow*> out;
  for (const auto& r : rows) {
    if (r.hard && r.need > r.have && r.have >= 0) out.push_back(&r);
  }
  return out;
}

DensityPlan PlanDensity(const HostLimits& host, const DensityInputs& in) {
  DensityPlan plan;
  // The rows are computed twice: first to find what the host holds (the maximum 0), then with
  // the maximum's needs.
  auto build = [&](int64_t n) {
    std::vector<LimitRow> rows;
    const int64_t fixed_fds = kBaseFds + in.held_fds + in.pooled * kFdsPerSandbox;
    rows.push_back(
        {.id = "limits.open_files",
         .title = "sbxd's open files",
         .have = host.nofile_hard,
         .need = fixed_fds + n * kFdsPerSandbox,
         .holds = Holds(host.nofile_hard, fixed_fds, kFdsPerSandbox),
         .fix = fmt::format("LimitNOFILE={} in sbxd's systemd unit (or `ulimit -n {}` before "
                            "starting it): sbxd raises its soft limit to the hard one, but a "
                            "hard limit rises only with CAP_SYS_RESOURCE; fs.nr_open caps it",
                            Roomy(fixed_fds + n * kFdsPerSandbox),
                            Roomy(fixed_fds + n * kFdsPerSandbox))});
    if (!in.ns) return rows;
    const int64_t held = n + in.pooled;
    const int64_t fixed_tasks = kHostTasks + in.pooled * kTasksPerSandbox;
    const int64_t tasks = kHostTasks + held * kTasksPerSandbox;
    rows.push_back({.id = "limits.pids",
                    .title = "kernel.pid_max",
                    .have = host.pid_max,
                    .need = tasks,
                    .holds = Holds(host.pid_max, fixed_tasks, kTasksPerSandbox),
                    .fix = fmt::format("sysctl -w kernel.pid_max={} (persist it in "
                                       "/etc/sysctl.d/); every idle sandbox takes {} pids, its "
                                       "processes more",
                                       Roomy(tasks), kTasksPerSandbox)});
    rows.push_back({.id = "limits.threads",
                    .title = "kernel.threads-max",
                    .have = host.threads_max,
                    .need = tasks,
                    .holds = Holds(host.threads_max, fixed_tasks, kTasksPerSandbox),
                    .fix = fmt::format("sysctl -w kernel.threads-max={}", Roomy(tasks))});
    for (const auto& [type, have] : host.max_namespaces) {
      if (type == "user" && !in.user_namespaces) continue;
      rows.push_back({.id = fmt::format("limits.{}_namespaces", type),
                      .title = fmt::format("user.max_{}_namespaces", type),
                      .have = have,
                      .need = held,
                      .holds = Holds(have, in.pooled, 1),
                      .fix = fmt::format("sysctl -w user.max_{}_namespaces={} (it counts root's "
                                         "namespaces too)",
                                         type, Roomy(held))});
    }
    if (in.user_namespaces && in.uid_ranges > 0) {
      rows.push_back({.id = "limits.uid_ranges",
                      .title = "uid ranges",
                      .have = in.uid_ranges,
                      .need = held,
                      .holds = Holds(in.uid_ranges, in.pooled, 1),
                      .fix = fmt::format("none on one host: each sandbox's user namespace maps "
                                         "{} uids of systemd's container range, which holds {}",
                                         ns::kUidRangeSize, in.uid_ranges)});
    }
    const int64_t kernel_mib =
        (ShrinkerMapBytes(held, host.numa_nodes, host.memcgs_per_sandbox) + held * kLinearKiBPerSandbox * 1024) >> 20;
    const int64_t budget = host.mem_total_mib * kKernelMemoryWarnPercent / 100;
    // The largest count whose estimate fits the budget (the estimate grows with n).
    int64_t lo = 0, hi = 1 << 22;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      const int64_t mib = (ShrinkerMapBytes(mid, host.numa_nodes, host.memcgs_per_sandbox) +
                           mid * kLinearKiBPerSandbox * 1024) >> 20;
      if (mib <= budget) lo = mid; else hi = mid - 1;
    }
    rows.push_back(
        {.id = "limits.kernel_memory",
         .title = "kernel memory of idle sandboxes",
         .have = budget,
         .need = kernel_mib,
         .holds = std::max<int64_t>(0, lo - in.pooled),
         .hard = false,
         .fix = fmt::format("run fewer sandboxes per host (or hosts with more memory): each "
                            "memory cgroup maps every mount's shrinker, so the kernel memory of "
                            "N sandboxes grows as the square of N ({} MiB estimated, {}% of MemTotal is {} "
                            "MiB)",
                            kernel_mib, kKernelMemoryWarnPercent, budget)});
    return rows;
  };
  std::vector<LimitRow> first = build(0);
  plan.host_holds = INT64_MAX;
  for (const auto& r : first) {
    if (r.hard && r.holds < plan.host_holds) {
      plan.host_holds = r.holds;
      plan.bottleneck = r.title;
    }
  }
  plan.max_sandboxes = in.max_sandboxes > 0 ? in.max_sandboxes : plan.host_holds;
  plan.rows = build(plan.max_sandboxes);
  for (const auto& r : plan.rows) {
    if (r.id == "limits.kernel_memory") plan.kernel_memory_mib = r.need;
  }
  return plan;
}

std::string DescribeShort(const DensityPlan& plan) {
  std::string out;
  for (const LimitRow* r : plan.Short()) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{} is {}, holds {} sandboxes, {} needs {}: {}", r->title, r->have,
                       r->holds, plan.max_sandboxes, r->need, r->fix);
  }
  return out;
}

int64_t DefaultHeldFds(int64_t nofile) {
  // server.max_connections 0: a quarter of RLIMIT_NOFILE, at most 4096; the 16 reserved
  // connections, and as many spare descriptors plus one (docs/config.md, [server]).
  return std::min<int64_t>(4096, nofile / 4) + 16 + 17;
}

void CheckDensity(const Context& ctx) {
  const DoctorOptions& o = ctx.opts;
  absl::StatusOr<HostLimits> host = ReadHostLimits(ctx.live ? "/" : o.host_root);
  if (!host.ok()) {
    ctx.Add(Check{"limits.sandboxes", "sandboxes this host holds", CheckResult::kWarn,
                  std::string(host.status().message()), "", false});
    return;
  }
  DensityInputs in;
  in.max_sandboxes = o.max_sandboxes;
  in.ns = ctx.ns;
  in.user_namespaces = o.user_namespaces;
  in.pooled = o.pooled;
  in.held_fds = o.held_fds > 0 ? o.held_fds : DefaultHeldFds(host->nofile_hard);
  in.uid_ranges = (ns::kUidRangeEnd - ns::kUidRangeFirst) / ns::kUidRangeSize;
  const DensityPlan plan = PlanDensity(*host, in);
  const bool short_any = !plan.Short().empty();
  ctx.Add(Check{
      "limits.sandboxes", "sandboxes this host holds",
      short_any ? CheckResult::kWarn : CheckResult::kOk,
      fmt::format("{} (set by {}); {}", plan.host_holds, plan.bottleneck,
                  o.max_sandboxes > 0
                      ? fmt::format("the maximum asked for is {}", o.max_sandboxes)
                      : std::string("sbxd with admission.max_sandboxes 0 caps creates there")),
      short_any ? fmt::format("raise the limits below, or --max-sandboxes {}", plan.host_holds)
                : "",
      false});
  for (const LimitRow& r : plan.rows) {
    const bool low = r.need > r.have && r.have >= 0;
    std::string detail =
        r.have < 0 ? std::string("unreadable")
                   : fmt::format("{} holds {} sandboxes; {} need {}", r.have, r.holds,
                                 plan.max_sandboxes, r.need);
    if (r.id == "limits.kernel_memory") {
      detail = fmt::format("~{} MiB for {} sandboxes, {}% of MemTotal is {} MiB (holds {})",
                           r.need, plan.max_sandboxes, kKernelMemoryWarnPercent, r.have, r.holds);
    }
    ctx.Add(Check{r.id, r.title, low ? CheckResult::kWarn : CheckResult::kOk, detail,
                  low ? r.fix : "", false});
  }
}

}  // namespace sbx::runtime::doctor
