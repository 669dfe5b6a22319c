// Cgroups of the ns runtime: layout detection, the CgroupDriver interface and the RAII owner
// of one sandbox's cgroup directories.
//
// Two drivers sit behind CgroupDriver:
//   * v1 / hybrid (cgroup_v1_hybrid.cc): memory, pids and cpu controllers of cgroup v1, each
//     under the process's own cgroup of that hierarchy, plus a directory in the v2 unified
//     hierarchy when one is mounted (it has no controllers on hybrid hosts but provides
//     cgroup.kill, cgroup.events and CLONE_INTO_CGROUP).
//   * pure v2 (cgroup_v2.cc): memory.max, pids.max, cpu.max.
// Either way a sandbox's directories are `<own cgroup>/sbx/<sandbox id>` in every hierarchy, or
// `<cgroup parent>/<sandbox id>` when CgroupEnv::parent names one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

// Name of the per-process parent directory that holds every sandbox cgroup.
inline constexpr char kCgroupParentName[] = "sbx";
// On pure v2 the daemon moves itself into this leaf when its own cgroup must become an inner
// node (no-internal-processes rule).
inline constexpr char kCgroupDaemonLeaf[] = "sbxd";
// Hierarchy key of the v2 directory in Paths() and Persist() output.
inline constexpr char kUnifiedKey[] = "unified";

struct CgroupLimits {
  int64_t memory_bytes = 0;  // > 0
  int64_t pids = 0;          // > 0
  int64_t cpu_quota_us = 0;  // > 0, per cpu_period_us
  int64_t cpu_period_us = 100000;
  // > 0: the workload (every sandbox process but the agent) gets a child `work` with
  // memory_bytes and pids, under one CPU quota on the sandbox's directory, and the agent gets a
  // budget of its own the workload cannot touch. The OOM killer and pids.max then act on the
  // workload only: a memory or fork bomb cannot take or starve the agent. Where the agent sits
  // depends on the driver (SandboxCgroup::agent_leaf()):
  //   * v1 / hybrid: in the sandbox's directory itself, whose limits are the workload's plus
  //     these, so the agent always has at least this much left. One memory cgroup fewer than
  //     a child of its own: every memory cgroup costs the kernel a shrinker map sized by the
  //     host's superblocks (docs/benchmarks.md, density).
  //   * pure v2: in a child `agent` with these limits (no-internal-processes rule: the
  //     sandbox's directory enables controllers for `work`, so it cannot hold the agent).
  // 0: one directory for all (sandboxes made before the split).
  int64_t agent_memory_bytes = 0;
  int64_t agent_pids = 0;
};

// The children of a split sandbox cgroup (CgroupLimits::agent_memory_bytes). `agent` exists on
// pure v2 only, and in v1 hierarchies of sandboxes made before the agent moved into the
// sandbox's directory there.
inline constexpr char kAgentLeaf[] = "agent";
inline constexpr char kWorkLeaf[] = "work";
// cpu.weight (v2) of the agent's child: ten times the workload's default, so a CPU-bound
// workload cannot starve the agent within the sandbox's quota.
inline constexpr int kAgentCpuWeight = 1000;
// v1: the agent's tasks (weight 1024 each at nice 0) compete with the `work` group in the
// sandbox's directory; a tenth of that on `work` keeps the same 10:1 ratio as v2.
inline constexpr int kWorkCpuShares = 102;

// Where to look. Real hosts use the defaults; unit tests point both at a fake tree.
struct CgroupEnv {
  std::string proc_root = "/proc";
  // Empty: mount points are used as /proc/mounts lists them. Otherwise mount points under
  // /sys/fs/cgroup (or any other path) are looked up below this directory instead.
  std::string cgroupfs_root;
  // Fake trees are plain directories whose control files do not appear by themselves.
  bool create_control_files = false;
  // Where sandbox cgroups go, the same path in every hierarchy. Empty: `<own cgroup>/sbx`,
  // below the process's own cgroup. An absolute cgroup path (e.g. "/sbx"): that directory,
  // outside sbxd's own cgroup, so the service manager can restart sbxd on pure cgroup v2 while
  // sandboxes run (a systemd unit's cgroup that hands controllers to sandboxes may not take
  // the new main process: status 219/CGROUP). Checked by ValidateCgroupParent.
  std::string parent;
};

// "" or an absolute, normalized cgroup path other than "/" ("..", "." and empty components
// refused): the value of runtime.ns.cgroup_parent.
absl::Status ValidateCgroupParent(const std::string& parent);

// What /proc/self/cgroup and /proc/mounts say.
struct CgroupLayout {
  struct V1Hierarchy {
    std::string mount;                     // mount point (rebased), e.g. /sys/fs/cgroup/memory
    std::string own;                       // our cgroup in it, e.g. /process_api/<hash>
    std::vector<std::string> controllers;  // e.g. {"cpu","cpuacct"}
  };
  // Keyed by the controllers the runtime uses: "memory", "pids", "cpu", "freezer". Missing keys
  // are controllers that are not mounted.
  std::map<std::string, V1Hierarchy> v1;
  bool has_v2 = false;
  std::string v2_mount;  // e.g. /sys/fs/cgroup/unified or /sys/fs/cgroup
  std::string v2_own;    // our cgroup in it, from the "0::" line
  // v1 "freezer" alone (it is detected too) does not make a host hybrid.
  bool pure_v2() const {
    return has_v2 && !v1.count("memory") && !v1.count("pids") && !v1.count("cpu");
  }
};

absl::StatusOr<CgroupLayout> DetectCgroupLayout(const CgroupEnv& env);

// Owns the cgroup directories of one sandbox (one per hierarchy). The destructor kills what
// runs in them and removes the directories it created unless Release() handed them to a
// long-lived sandbox, which then calls Destroy() explicitly.
class SandboxCgroup {
 public:
  struct Dir {
    std::string key;   // "memory", "pids", "cpu", "freezer" or "unified"
    std::string path;  // absolute directory
    bool v2 = false;
    bool created = false;  // made by us (or adopted): Destroy() removes only these
  };

  SandboxCgroup(std::string id, std::vector<Dir> dirs);
  ~SandboxCgroup();
  SandboxCgroup(const SandboxCgroup&) = delete;
  SandboxCgroup& operator=(const SandboxCgroup&) = delete;

  const std::string& id() const { return id_; }
  const std::vector<Dir>& dirs() const { return dirs_; }
  std::vector<Dir>& mutable_dirs() { return dirs_; }
  // {"memory": path, ...}
  nlohmann::json ToJson() const;
  // The v2 directory, "" when the host has none.
  std::string v2_path() const;
  // The file whose `oom_kill N` line counts the OOM kills inside this sandbox: v1
  // `memory.oom_control` where a v1 memory directory exists (hybrid hosts; their v2 directory
  // has no memory controller), else v2 `memory.events`. "" without either. sbxd hands it to
  // the agent (read-only fd), which attributes kills to sessions; see src/agent/oom.h.
  std::string OomCounterPath() const;

  // cgroup.procs of every directory to join by writing "0" from the child, except the v2
  // directory when `skip_v2` (the child is then placed with CLONE_INTO_CGROUP). `leaf`: of
  // that child of each directory (kAgentLeaf, kWorkLeaf) instead.
  absl::StatusOr<std::vector<UniqueFd>> OpenProcsFiles(bool skip_v2, const std::string& leaf = "") const;
  // O_PATH|O_DIRECTORY fd of the v2 directory (or its child `leaf`) for CLONE_INTO_CGROUP.
  absl::StatusOr<UniqueFd> OpenV2Dir(const std::string& leaf = "") const;
  // Whether the directories have a work child (CgroupLimits::agent_memory_bytes).
  bool Split() const;
  // Where the agent of a split sandbox goes, relative to each directory: "" (the directory
  // itself, v1 / hybrid) or kAgentLeaf (pure v2). Set by the driver's Create.
  const std::string& agent_leaf() const { return agent_leaf_; }
  void set_agent_leaf(std::string leaf) { agent_leaf_ = std::move(leaf); }
  // The file whose `oom_kill N` line counts the OOM kills of the agent of a split sandbox (v1
  // memory.oom_control counts only its own cgroup's tasks, not its children's): "" when the
  // sandbox is not split or has no memory directory.
  std::string AgentOomCounterPath() const;
  // Every pid listed in the directories and their children (duplicates across hierarchies
  // removed); missing directories list nothing.
  std::vector<pid_t> Pids() const;

  // SIGKILLs every process in the sandbox's cgroups: cgroup.kill where there is a v2
  // directory, otherwise every pid listed in cgroup.procs.
  absl::Status Kill() const;
  // Waits until no process is left (v2 cgroup.events "populated 0", else empty v1
  // cgroup.procs, re-killing stragglers), at most until `deadline`.
  absl::Status WaitEmpty(std::chrono::steady_clock::time_point deadline) const;
  // rmdir of every directory we created; missing ones are fine.
  absl::Status Remove(std::chrono::steady_clock::time_point deadline);
  // Kill + WaitEmpty + Remove with the default deadline. Idempotent.
  absl::Status Destroy();

  // Freezer (cgroup_freezer.cc): v2 `cgroup.freeze` where the sandbox has a v2 directory (also
  // on hybrid hosts: it needs no controller), else the v1 freezer hierarchy's `freezer.state`.
  bool CanFreeze() const;
  // Returns once the kernel reports every task frozen (v2: cgroup.events "frozen 1"; v1:
  // freezer.state FROZEN), at most until `deadline`. Does not undo a partial freeze on error.
  absl::Status Freeze(std::chrono::steady_clock::time_point deadline) const;
  absl::Status Thaw(std::chrono::steady_clock::time_point deadline) const;
  // True when a freeze is requested (v2 cgroup.freeze 1; v1 FREEZING or FROZEN).
  absl::StatusOr<bool> FreezeRequested() const;

  void Release() { armed_ = false; }

 private:
  // Frozen tasks of the v1 freezer die of SIGKILL only once thawed: Kill() thaws after it has
  // signalled everything, so nothing runs again in between. Best effort. v2 needs no thaw.
  void ThawAfterKill() const;

  std::string id_;
  std::vector<Dir> dirs_;
  std::string agent_leaf_ = kAgentLeaf;
  bool armed_ = true;
};

// How long Destroy() waits for a cgroup to empty before failing loudly.
inline constexpr std::chrono::milliseconds kCgroupDrainTimeout{5000};
// How long Freeze()/Thaw() callers give the kernel (a few ms is normal, feasibility 2f/2i).
inline constexpr std::chrono::milliseconds kCgroupFreezeTimeout{5000};
// Hierarchy key of the v1 freezer directory (only on v1 hosts without a v2 hierarchy).
inline constexpr char kFreezerKey[] = "freezer";

class CgroupDriver {
 public:
  virtual ~CgroupDriver() = default;
  virtual std::string Name() const = 0;
  // One-time preparation of the host (parent `sbx` directories; on v2 the subtree_control
  // delegation). Idempotent.
  virtual absl::Status Setup() = 0;
  // Fails with a message naming the missing controller when a limit cannot be enforced.
  virtual absl::Status CheckLimits(const CgroupLimits& limits) const = 0;
  // The directories a sandbox with this id has (or would have), keyed by hierarchy.
  virtual std::vector<SandboxCgroup::Dir> SandboxDirs(const std::string& id) const = 0;
  // Directories whose subdirectories are sandbox cgroups (for Sweep).
  virtual std::vector<std::string> ParentDirs() const = 0;
  // mkdir + write the limits. On error nothing is left behind.
  virtual absl::StatusOr<std::unique_ptr<SandboxCgroup>> Create(const std::string& id,
                                                                const CgroupLimits& limits) = 0;
  // True when children should be placed with clone3(CLONE_INTO_CGROUP) in the v2 directory.
  virtual bool UseCloneIntoCgroup() const = 0;
  // True when a launch joins some hierarchy by writing cgroup.procs (v1 controllers), which is
  // what cgroup_favor.h speeds up.
  virtual bool JoinsByWritingProcs() const = 0;
  // True when sandboxes can be frozen (a v2 hierarchy or the v1 freezer is mounted).
  virtual bool CanFreeze() const = 0;
  // Removes the pooled sets an earlier run with this `tag` left (cgroup_pool.h), then, when
  // `size` > 0, keeps that many sets of the driver's v1 directories built ahead for Create.
  // Returns how many directories per set are pooled: 0 where nothing can be (pure v2 has no
  // rename), and always 0 with `size` 0.
  virtual absl::StatusOr<int> StartPool(int size, const std::string& tag) {
    (void)size;
    (void)tag;
    return 0;
  }

  // An owner for existing directories of `id` (Adopt, Sweep): all are treated as ours.
  std::unique_ptr<SandboxCgroup> Existing(const std::string& id) const;
};

std::unique_ptr<CgroupDriver> MakeV1HybridDriver(const CgroupLayout& layout, const CgroupEnv& env);
std::unique_ptr<CgroupDriver> MakeV2Driver(const CgroupLayout& layout, const CgroupEnv& env);
// Checks env.parent, detects the layout and picks the driver: pure v2 when no v1 controller we
// use is mounted.
absl::StatusOr<std::unique_ptr<CgroupDriver>> MakeCgroupDriver(const CgroupEnv& env);

// The tightest limits set on any of `dirs` (cgroup directories, e.g. a driver's ParentDirs())
// or on their ancestors up to each hierarchy's root: what every sandbox below them shares.
// Read from v2 (memory.max, cpu.max) and v1 (memory.limit_in_bytes, cpu.cfs_quota_us and
// cpu.cfs_period_us) files; "max", -1 and v1's page-rounded LLONG_MAX mean none (0).
struct CgroupCeiling {
  int64_t memory_bytes = 0;
  int64_t cpu_millis = 0;
};
CgroupCeiling ReadCgroupCeiling(const std::vector<std::string>& dirs);

// Helpers shared by the drivers.
namespace cgroup_internal {
std::string Join(const std::string& a, const std::string& b);
absl::Status WriteControl(const CgroupEnv& env, const std::string& dir, const std::string& file,
                          const std::string& value);
bool FileExists(const std::string& path);
}  // namespace cgroup_internal

}  // namespace sbx::runtime::ns
