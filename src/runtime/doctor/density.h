// Density: how many sandboxes this host's limits hold, and what a configured maximum needs.
// Used by `sbx doctor` (the `limits.*` rows), and by sbxd at start-up, which caps
// admission.max_sandboxes at what the host holds or refuses an explicit maximum it cannot.
//
// The per-sandbox costs are measured on the ns runtime with idle sandboxes (issue 15: 3,449
// sandboxes of the base template on Linux 6.18, see docs/doctor.md, "Density"); a sandbox that
// runs processes costs more pids. The arithmetic is pure (unit-tested); ReadHostLimits reads
// /proc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::runtime::doctor {

// sbxd holds one descriptor per sandbox at rest: its agent's pidfd (agent sockets are opened
// per request and closed).
inline constexpr int64_t kFdsPerSandbox = 1;
// Descriptors sbxd holds whatever the sandbox count: the store, logs, listeners, epoll, the
// pools' and workers' transient ones (a launch holds ~20 for a few ms).
inline constexpr int64_t kBaseFds = 256;
// Tasks (pids, and threads) per idle sandbox: its agent, and the kernel's
// "kworker/R-ext4-rsv-conversion" rescuer thread of its ext4 disk's mount.
inline constexpr int64_t kTasksPerSandbox = 2;
// Tasks left for the host itself (its daemons, sbxd's threads, builds, a shell).
inline constexpr int64_t kHostTasks = 4096;
// Memory cgroups per sandbox: <id>, <id>/agent, <id>/work on a pure cgroup v2 host (v2 allows
// no process beside child cgroups); <id> (the agent) and <id>/work where the memory controller
// is v1's (a hybrid host). docs/isolation.md, step 8.
inline constexpr int64_t kMemcgsPerSandboxV2 = 3;
inline constexpr int64_t kMemcgsPerSandboxV1 = 2;
// Superblocks per sandbox of the base template, each a memcg-aware shrinker: its ext4 disk,
// the root overlay, one read-only overlay serving /usr and /etc, proc, /dev, devpts, /dev/shm,
// /tmp (masks are clones of a directory on the disk, no superblock of their own).
inline constexpr int64_t kSuperblocksPerSandbox = 8;
// Every memory cgroup keeps a map of every memcg-aware shrinker of the host, in units of 64
// shrinkers of 520 bytes (kmalloc-1k), per NUMA node, never shrunk while the cgroup lives: the
// kernel memory of N sandboxes grows as N² (6.7 GiB of kmalloc-1k at 3,449 sandboxes).
inline constexpr int64_t kShrinkerUnitBytes = 1024;
inline constexpr int64_t kShrinkersPerUnit = 64;
// The rest of an idle sandbox's kernel and agent memory, linear in N (MemAvailable drop / N at
// 500 sandboxes, less the shrinker maps).
inline constexpr int64_t kLinearKiBPerSandbox = 700;
// sbx-doctor warns when that estimate passes this share of MemTotal: past it, every reclaim
// walks shrinker maps of every cgroup (shrink_slab took 60% of both CPUs at 3,300 sandboxes).
inline constexpr int64_t kKernelMemoryWarnPercent = 25;

// The host's limits that sandboxes count against.
struct HostLimits {
  int64_t nofile_soft = 0;
  int64_t nofile_hard = 0;  // sbxd raises its soft limit to this at start-up
  int64_t pid_max = 0;       // kernel.pid_max
  int64_t threads_max = 0;   // kernel.threads-max
  // user.max_<type>_namespaces for mnt, pid, net, ipc, uts, cgroup, time, user (-1: unread).
  // They count root's namespaces too (per-user ucounts).
  std::vector<std::pair<std::string, int64_t>> max_namespaces;
  int64_t mem_total_mib = 0;
  int64_t numa_nodes = 1;
  int64_t memcgs_per_sandbox = kMemcgsPerSandboxV2;  // kMemcgsPerSandboxV1 on a hybrid host
};

// Reads /proc/sys, /proc/meminfo, /sys/devices/system/node and this process's RLIMIT_NOFILE.
// Files under `host_root` (tests: a fake /proc); the rlimit is always this process's.
absl::StatusOr<HostLimits> ReadHostLimits(const std::string& host_root = "/");

struct DensityInputs {
  int64_t max_sandboxes = 0;  // 0: as many as the host holds
  bool ns = true;             // the ns runtime (else fake: only descriptors count)
  bool user_namespaces = true;
  int64_t pooled = 0;         // sandboxes and namespaces the pools hold beside them
  int64_t held_fds = 0;       // sbxd's descriptors besides sandboxes (connections, spares)
  int64_t uid_ranges = 0;     // uid ranges there are (userns.h)
};

struct LimitRow {
  std::string id;     // "limits.open_files"
  std::string title;  // "sbxd's open files"
  int64_t have = 0;   // the limit
  int64_t need = 0;   // what the maximum needs
  int64_t holds = 0;  // sandboxes the limit holds
  bool hard = true;   // a launch fails past it (else: a warning, kernel memory)
  std::string fix;    // how to raise it to `need`
};

struct DensityPlan {
  int64_t host_holds = 0;     // the least `holds` of the hard rows
  std::string bottleneck;     // the row that sets it
  int64_t max_sandboxes = 0;  // the configured maximum, or host_holds for 0
  int64_t kernel_memory_mib = 0;  // estimated at max_sandboxes
  std::vector<LimitRow> rows;
  // The hard rows whose limit is below the maximum's need.
  std::vector<const LimitRow*> Short() const;
};

// The memcg shrinker maps of n sandboxes beside each other, in bytes (see above).
int64_t ShrinkerMapBytes(int64_t n, int64_t numa_nodes,
                         int64_t memcgs_per_sandbox = kMemcgsPerSandboxV2);

DensityPlan PlanDensity(const HostLimits& host, const DensityInputs& in);

// sbxd's descriptors besides sandboxes with the default connection caps under `nofile`.
int64_t DefaultHeldFds(int64_t nofile);

// "open files (LimitNOFILE=21000); kernel.pid_max (sysctl -w kernel.pid_max=14336)": the short
// rows with their fixes, for a start-up error.
std::string DescribeShort(const DensityPlan& plan);

}  // namespace sbx::runtime::doctor
