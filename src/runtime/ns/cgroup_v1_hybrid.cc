// cgroup v1 driver, with the v2 unified hierarchy alongside when it is mounted (hybrid hosts
// such as the project's machines: memory, pids and cpu live on v1; /sys/fs/cgroup/unified has
// no controllers but gives cgroup.kill, cgroup.events, cgroup.freeze and CLONE_INTO_CGROUP).
// Without v2, the v1 freezer hierarchy (when mounted) provides pause.
//
// Each controller's directory sits under the process's OWN cgroup of that hierarchy: on hosts
// where a machine agent owns part of the tree (here memory is nested at /process_api/<hash>),
// creating groups at the hierarchy root or beside the agent's groups would escape or disturb it.
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/cgroup_pool.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

using cgroup_internal::Join;
using cgroup_internal::WriteControl;

namespace {

class V1HybridDriver : public CgroupDriver {
 public:
  V1HybridDriver(CgroupLayout layout, CgroupEnv env)
      : layout_(std::move(layout)), env_(std::move(env)) {}

  std::string Name() const override {
    return layout_.has_v2 ? "cgroup-v1+v2-hybrid" : "cgroup-v1";
  }

  absl::Status Setup() override {
    for (const std::string& dir : ParentDirs()) {
      SBX_RETURN_IF_ERROR(Annotate(MkdirAll(dir, 0755), "cgroup setup"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckLimits(const CgroupLimits& l) const override {
    struct Need {
      const char* controller;
      bool wanted;
      const char* what;
    } needs[] = {{"memory", l.memory_bytes > 0, "memory"},
                 {"pids", l.pids > 0, "process-count"},
                 {"cpu", l.cpu_quota_us > 0, "CPU"}};
    for (const auto& n : needs) {
      if (n.wanted && layout_.v1.count(n.controller) == 0) {
        return absl::FailedPreconditionError(fmt::format(
            "cgroup: the {0} controller is not mounted (no cgroup v1 hierarchy with '{0}' in "
            "/proc/mounts), so the sandbox's {1} limit cannot be enforced; mount it (e.g. "
            "mount -t cgroup -o {0} cgroup /sys/fs/cgroup/{0}) or use a pure cgroup v2 host",
            n.controller, n.what));
      }
    }
    return absl::OkStatus();
  }

  std::vector<SandboxCgroup::Dir> SandboxDirs(const std::string& id) const override {
    std::vector<SandboxCgroup::Dir> out;
    for (const auto& [key, parent] : Parents()) {
      out.push_back(SandboxCgroup::Dir{key, Join(parent, id), key == kUnifiedKey, false});
    }
    return out;
  }

  std::vector<std::string> ParentDirs() const override {
    std::vector<std::string> out;
    for (const auto& [key, parent] : Parents()) out.push_back(parent);
    return out;
  }

  absl::StatusOr<std::unique_ptr<SandboxCgroup>> Create(const std::string& id,
                                                        const CgroupLimits& l) override {
    SBX_RETURN_IF_ERROR(CheckLimits(l));
    auto cg = std::make_unique<SandboxCgroup>(id, SandboxDirs(id));
    // Split: the workload in work/ with its limits; the agent in the sandbox's directory
    // itself, whose limits are the workload's plus the agent's, so the workload can never take
    // the agent's share (its own limit is lower) and an OOM kill or pids.max of the workload
    // stays in work/. v1 allows tasks beside child cgroups, and this keeps a sandbox at two
    // memory cgroups instead of three (docs/isolation.md, "Cgroups").
    const bool split = l.agent_memory_bytes > 0 || l.agent_pids > 0;
    cg->set_agent_leaf("");
    // Pooled sets are split ones (the work child is made with them).
    std::unique_ptr<PooledCgroupSet> pooled = split && pool_ ? pool_->Take() : nullptr;
    for (auto& d : cg->mutable_dirs()) {
      if (pooled && pooled->dirs().count(d.key) > 0) {
        SBX_RETURN_IF_ERROR(pooled->RenameTo(d.key, d.path));
        d.created = true;
        continue;
      }
      if (::mkdir(d.path.c_str(), 0755) != 0) {
        return ErrnoStatus(errno, fmt::format("create cgroup: mkdir({})", d.path));
      }
      d.created = true;
      if (split) {
        const std::string child = Join(d.path, kWorkLeaf);
        if (::mkdir(child.c_str(), 0755) != 0) {
          return ErrnoStatus(errno, fmt::format("create cgroup: mkdir({})", child));
        }
      }
    }
    auto memory = [&](const std::string& dir, int64_t bytes) -> absl::Status {
      const std::string v = std::to_string(bytes);
      SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, dir, "memory.limit_in_bytes", v), "cgroup memory limit"));
      // Without this a sandbox could spill past its limit into swap where swap exists.
      if (HasMemsw(dir)) {
        SBX_RETURN_IF_ERROR(
            Annotate(WriteControl(env_, dir, "memory.memsw.limit_in_bytes", v), "cgroup memory limit"));
      }
      return absl::OkStatus();
    };
    // The sandbox's total: the workload's limit plus the agent's budget.
    auto sum = [](int64_t workload, int64_t agent) { return workload > 0 && agent > 0 ? workload + agent : 0; };
    for (const auto& d : cg->dirs()) {
      const std::string work = split ? Join(d.path, kWorkLeaf) : d.path;
      if (d.key == "memory") {
        if (split) {
          if (int64_t total = sum(l.memory_bytes, l.agent_memory_bytes); total > 0) {
            SBX_RETURN_IF_ERROR(Annotate(memory(d.path, total), "sandbox total (workload + agent)"));
          }
        }
        if (l.memory_bytes > 0) SBX_RETURN_IF_ERROR(memory(work, l.memory_bytes));
      }
      if (d.key == "pids") {
        if (split) {
          if (int64_t total = sum(l.pids, l.agent_pids); total > 0) {
            SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, d.path, "pids.max", std::to_string(total)),
                                         "cgroup pids limit: sandbox total (workload + agent)"));
          }
        }
        if (l.pids > 0) {
          SBX_RETURN_IF_ERROR(Annotate(
              WriteControl(env_, work, "pids.max", std::to_string(l.pids)), "cgroup pids limit"));
        }
      }
      if (d.key == "cpu") {
        if (l.cpu_quota_us > 0) {
          // Each write of the period or the quota walks every task group of the host
          // (tg_set_cfs_bandwidth → __cfs_schedulable), so it costs more the more sandboxes
          // run: a new cgroup starts with the kernel's default period (100 ms, what sandboxes
          // use), and then only the quota is written.
          // That default is the kernel's constant, so it is read from the first sandbox's
          // cgroup only.
          const std::string period = std::to_string(l.cpu_period_us);
          if (l.cpu_period_us != DefaultPeriod(d.path)) {
            SBX_RETURN_IF_ERROR(
                Annotate(WriteControl(env_, d.path, "cpu.cfs_period_us", period), "cgroup cpu limit"));
          }
          SBX_RETURN_IF_ERROR(
              Annotate(WriteControl(env_, d.path, "cpu.cfs_quota_us", std::to_string(l.cpu_quota_us)),
                       "cgroup cpu limit"));
        }
        if (split) {
          SBX_RETURN_IF_ERROR(Annotate(
              WriteControl(env_, work, "cpu.shares", std::to_string(kWorkCpuShares)), "workload cgroup cpu share"));
        }
      }
    }
    return cg;
  }

  absl::StatusOr<int> StartPool(int size, const std::string& tag) override {
    std::map<std::string, std::string> parents;
    std::vector<std::string> dirs;
    for (const auto& [key, parent] : Parents()) {
      if (key == kUnifiedKey) continue;  // v2: no rename
      parents[key] = parent;
      dirs.push_back(parent);
    }
    SBX_RETURN_IF_ERROR(SweepCgroupPoolLeftovers(dirs, tag));
    if (size <= 0 || parents.empty()) return 0;
    pool_ = std::make_unique<CgroupSetPool>(size, std::move(parents), tag);
    pool_->Start();
    return static_cast<int>(dirs.size());
  }

  bool UseCloneIntoCgroup() const override { return layout_.has_v2; }
  bool JoinsByWritingProcs() const override { return true; }

  bool CanFreeze() const override { return layout_.has_v2 || layout_.v1.count(kFreezerKey) > 0; }

 private:
  // `<mount><own>/sbx`, or `<mount><env.parent>` when configured.
  std::string ParentIn(const std::string& mount, const std::string& own) const {
    return env_.parent.empty() ? Join(Join(mount, own), kCgroupParentName) : Join(mount, env_.parent);
  }

  // (key, parent directory), one per distinct hierarchy: co-mounted controllers such as
  // cpu,cpuacct share one directory.
  std::vector<std::pair<std::string, std::string>> Parents() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const char* key : {"memory", "pids", "cpu"}) {
      auto it = layout_.v1.find(key);
      if (it == layout_.v1.end()) continue;
      std::string parent = ParentIn(it->second.mount, it->second.own);
      bool dup = false;
      for (const auto& p : out) dup = dup || p.second == parent;
      if (!dup) out.emplace_back(key, parent);
    }
    if (layout_.has_v2) {
      out.emplace_back(kUnifiedKey, ParentIn(layout_.v2_mount, layout_.v2_own));
    } else if (auto it = layout_.v1.find(kFreezerKey); it != layout_.v1.end()) {
      // Pause needs a freezer. v2's cgroup.freeze reports completion through cgroup.events;
      // the v1 freezer has to be polled, so it is used only on hosts without v2.
      out.emplace_back(kFreezerKey, ParentIn(it->second.mount, it->second.own));
    }
    return out;
  }

  // Whether memory.memsw.* exists (swap accounting): the same for every memory cgroup of the
  // host, so it is looked up once.
  bool HasMemsw(const std::string& dir) {
    int known = has_memsw_.load(std::memory_order_relaxed);
    if (known < 0) {
      known = cgroup_internal::FileExists(Join(dir, "memory.memsw.limit_in_bytes")) ? 1 : 0;
      has_memsw_.store(known, std::memory_order_relaxed);
    }
    return known == 1;
  }

  // cpu.cfs_period_us of a new cgroup: read from the first sandbox whose cgroup has the file,
  // -1 while it cannot be read.
  int64_t DefaultPeriod(const std::string& new_dir) {
    int64_t known = default_period_.load(std::memory_order_relaxed);
    if (known != 0) return known;
    auto text = ReadFileToString(Join(new_dir, "cpu.cfs_period_us"));
    known = -1;
    if (text.ok()) {
      char* end = nullptr;
      const long long v = std::strtoll(text->c_str(), &end, 10);
      if (end != text->c_str() && v > 0) known = v;
    }
    // Unknown stays unknown for this sandbox only: the next one reads again.
    if (known > 0) default_period_.store(known, std::memory_order_relaxed);
    return known;
  }

  CgroupLayout layout_;
  CgroupEnv env_;
  std::atomic<int64_t> default_period_{0};  // 0: not read yet
  std::atomic<int> has_memsw_{-1};  // unknown until the first memory cgroup
  std::unique_ptr<CgroupSetPool> pool_;  // set once by StartPool, before any Create
};

}  // namespace

std::unique_ptr<CgroupDriver> MakeV1HybridDriver(const CgroupLayout& layout, const CgroupEnv& env) {
  return std::make_unique<V1HybridDriver>(layout, env);
}

}  // namespace sbx::runtime::ns
