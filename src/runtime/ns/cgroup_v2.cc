// Pure cgroup v2 driver (hosts with cgroup2 at /sys/fs/cgroup).
//
// v2's no-internal-processes rule: a cgroup that enables controllers for its children in
// cgroup.subtree_control may not itself hold processes (the root excepted). sbxd normally sits
// in its own cgroup (e.g. a systemd service with Delegate=yes), so before enabling
// +memory +pids +cpu there, Setup() moves the processes of that cgroup into a leaf
// `<own>/sbxd`. Sandboxes then live in `<own>/sbx/<id>`.
//
// With a configured parent (CgroupEnv::parent, e.g. /sbx) sandboxes live in `<parent>/<id>`
// instead and sbxd's own cgroup is left alone: systemd (before 254's DelegateSubgroup=) puts a
// restarted service's main process into the unit's cgroup itself, which the kernel refuses
// while that cgroup enables controllers for sandboxes below it.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/status_util.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

using cgroup_internal::Join;
using cgroup_internal::WriteControl;

namespace {

constexpr const char* kNeeded[] = {"memory", "pids", "cpu"};

std::set<std::string> Words(const std::string& s) {
  std::set<std::string> out;
  std::istringstream is(s);
  for (std::string w; is >> w;) out.insert(w);
  return out;
}

class V2Driver : public CgroupDriver {
 public:
  V2Driver(const CgroupLayout& layout, CgroupEnv env) : env_(std::move(env)) {
    std::string own = layout.v2_own.empty() ? "/" : layout.v2_own;
    // After a restart sbxd already sits in the leaf it moved itself into: the sandbox parent
    // belongs to the cgroup above it.
    size_t slash = own.rfind('/');
    if (slash != std::string::npos && own.substr(slash + 1) == kCgroupDaemonLeaf) {
      own = slash == 0 ? "/" : own.substr(0, slash);
    }
    own_ = own;
    mount_ = layout.v2_mount;
    base_ = env_.parent.empty() ? Join(layout.v2_mount, own_) : Join(mount_, env_.parent);
    parent_ = env_.parent.empty() ? Join(base_, kCgroupParentName) : base_;
  }

  std::string Name() const override { return "cgroup-v2"; }

  absl::Status Setup() override {
    if (!env_.parent.empty()) return SetupConfiguredParent();
    SBX_ASSIGN_OR_RETURN(std::string controllers,
                         ReadFileToString(Join(base_, "cgroup.controllers")));
    std::set<std::string> available = Words(controllers);
    std::vector<std::string> missing;
    for (const char* c : kNeeded) {
      if (available.count(c) == 0) missing.push_back(c);
    }
    available_ = available;
    if (!missing.empty()) {
      return absl::FailedPreconditionError(fmt::format(
          "cgroup v2 setup: controller(s) {} not available in {} (cgroup.controllers: \"{}\"); "
          "delegate them to sbxd's cgroup (systemd: Delegate=yes on the service)",
          fmt::join(missing, ", "), base_, Trim(controllers)));
    }

    const std::string enable = "+memory +pids +cpu";
    SBX_ASSIGN_OR_RETURN(std::string subtree,
                         ReadFileToString(Join(base_, "cgroup.subtree_control")));
    if (!HasAll(Words(subtree))) {
      if (own_ != "/") {
        SBX_ASSIGN_OR_RETURN(std::string procs, ReadFileToString(Join(base_, "cgroup.procs")));
        std::vector<pid_t> pids = ParsePidList(procs);
        if (!pids.empty()) {
          std::string leaf = Join(base_, kCgroupDaemonLeaf);
          if (::mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST) {
            return ErrnoStatus(errno, fmt::format("cgroup v2 setup: mkdir({})", leaf));
          }
          for (pid_t p : pids) {
            absl::Status s = WriteControl(env_, leaf, "cgroup.procs", std::to_string(p));
            // ESRCH: the process exited meanwhile.
            if (!s.ok() && !absl::IsNotFound(s)) return Annotate(s, "cgroup v2 setup: move sbxd to its leaf");
          }
        }
      }
      SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, base_, "cgroup.subtree_control", enable),
                                   "cgroup v2 setup: enable controllers"));
    }
    const std::string& parent = parent_;
    if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, fmt::format("cgroup v2 setup: mkdir({})", parent));
    }
    std::string parent_subtree =
        ReadFileToString(Join(parent, "cgroup.subtree_control")).value_or("");
    if (!HasAll(Words(parent_subtree))) {
      SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, parent, "cgroup.subtree_control", enable),
                                   "cgroup v2 setup: enable controllers for sandboxes"));
    }
    setup_done_ = true;
    return absl::OkStatus();
  }

  absl::Status CheckLimits(const CgroupLimits& l) const override {
    if (!setup_done_) {
      return absl::FailedPreconditionError(fmt::format(
          "cgroup v2: controllers were not delegated to {} (setup failed or not run)", base_));
    }
    for (const char* c : kNeeded) {
      if (available_.count(c) == 0) {
        return absl::FailedPreconditionError(
            fmt::format("cgroup v2: the {} controller is not available in {}", c, base_));
      }
    }
    return absl::OkStatus();
  }

  std::vector<SandboxCgroup::Dir> SandboxDirs(const std::string& id) const override {
    return {SandboxCgroup::Dir{kUnifiedKey, Join(parent_, id), true, false}};
  }

  std::vector<std::string> ParentDirs() const override { return {parent_}; }

  absl::StatusOr<std::unique_ptr<SandboxCgroup>> Create(const std::string& id,
                                                        const CgroupLimits& l) override {
    SBX_RETURN_IF_ERROR(CheckLimits(l));
    auto cg = std::make_unique<SandboxCgroup>(id, SandboxDirs(id));
    auto& d = cg->mutable_dirs()[0];
    if (::mkdir(d.path.c_str(), 0755) != 0) {
      return ErrnoStatus(errno, fmt::format("create cgroup: mkdir({})", d.path));
    }
    d.created = true;
    // Split (CgroupLimits::agent_memory_bytes): the workload's limits on work/, the agent's on
    // agent/, the CPU quota over both. The sandbox's directory then holds no process itself,
    // as v2 requires of one that enables controllers for its children.
    const bool split = l.agent_memory_bytes > 0 || l.agent_pids > 0;
    cg->set_agent_leaf(split ? kAgentLeaf : "");
    const std::string work = split ? Join(d.path, kWorkLeaf) : d.path;
    const std::string agent = Join(d.path, kAgentLeaf);
    if (split) {
      SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, d.path, "cgroup.subtree_control", "+memory +pids +cpu"),
                                   "cgroup: enable controllers for the agent and the workload"));
      for (const std::string& child : {agent, work}) {
        if (::mkdir(child.c_str(), 0755) != 0) {
          return ErrnoStatus(errno, fmt::format("create cgroup: mkdir({})", child));
        }
      }
    }
    // No memory.oom.group=1: it would make one OOM kill take every process of the session's
    // cgroup, and the agent watches memory.events (OomCounterPath) and kills the rest of the
    // OOM-killed session itself. Split, the agent is not in that cgroup at all.
    auto memory = [&](const std::string& dir, int64_t bytes) -> absl::Status {
      SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, dir, "memory.max", std::to_string(bytes)),
                                   "cgroup memory limit"));
      if (cgroup_internal::FileExists(Join(dir, "memory.swap.max"))) {
        SBX_RETURN_IF_ERROR(Annotate(WriteControl(env_, dir, "memory.swap.max", "0"), "cgroup memory limit"));
      }
      return absl::OkStatus();
    };
    if (l.memory_bytes > 0) SBX_RETURN_IF_ERROR(memory(work, l.memory_bytes));
    if (l.pids > 0) {
      SBX_RETURN_IF_ERROR(Annotate(
          WriteControl(env_, work, "pids.max", std::to_string(l.pids)), "cgroup pids limit"));
    }
    if (split) {
      if (l.agent_memory_bytes > 0) SBX_RETURN_IF_ERROR(Annotate(memory(agent, l.agent_memory_bytes), "agent"));
      if (l.agent_pids > 0) {
        SBX_RETURN_IF_ERROR(Annotate(
            WriteControl(env_, agent, "pids.max", std::to_string(l.agent_pids)), "agent cgroup pids limit"));
      }
      SBX_RETURN_IF_ERROR(Annotate(
          WriteControl(env_, agent, "cpu.weight", std::to_string(kAgentCpuWeight)), "agent cgroup cpu weight"));
    }
    if (l.cpu_quota_us > 0) {
      SBX_RETURN_IF_ERROR(Annotate(
          WriteControl(env_, d.path, "cpu.max",
                       fmt::format("{} {}", l.cpu_quota_us, l.cpu_period_us)),
          "cgroup cpu limit"));
    }
    return cg;
  }

  bool UseCloneIntoCgroup() const override { return true; }
  bool JoinsByWritingProcs() const override { return false; }

  bool CanFreeze() const override { return true; }  // cgroup.freeze needs no controller

 private:
  // Creates the configured parent and enables the controllers on the way down to it: in
  // every ancestor's cgroup.subtree_control (the root's included) and in the parent's own, for
  // the sandboxes. An ancestor other than the root that holds processes cannot enable them
  // (no-internal-processes rule): the error names it.
  absl::Status SetupConfiguredParent() {
    const std::string enable = "+memory +pids +cpu";
    std::string dir = mount_;
    std::vector<std::string> chain = {dir};
    std::istringstream parts(env_.parent);
    for (std::string part; std::getline(parts, part, '/');) {
      if (part.empty()) continue;
      dir = Join(dir, part);
      chain.push_back(dir);
    }
    for (size_t i = 0; i < chain.size(); ++i) {
      const std::string& d = chain[i];
      if (i > 0 && ::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoStatus(errno, fmt::format("cgroup v2 setup: mkdir({}) for cgroup parent {}", d, env_.parent));
      }
      SBX_ASSIGN_OR_RETURN(std::string controllers, ReadFileToString(Join(d, "cgroup.controllers")));
      std::set<std::string> available = Words(controllers);
      if (!HasAll(available)) {
        return absl::FailedPreconditionError(fmt::format(
            "cgroup v2 setup: memory, pids and cpu are not all available in {} (cgroup.controllers: "
            "\"{}\"), on the way to the cgroup parent {}; enable them in its parent's "
            "cgroup.subtree_control or choose another runtime.ns.cgroup_parent",
            d, Trim(controllers), env_.parent));
      }
      if (i + 1 == chain.size()) available_ = available;
      std::string subtree = ReadFileToString(Join(d, "cgroup.subtree_control")).value_or("");
      if (HasAll(Words(subtree))) continue;
      absl::Status st = WriteControl(env_, d, "cgroup.subtree_control", enable);
      if (!st.ok()) {
        return Annotate(st, fmt::format(
            "cgroup v2 setup: enable controllers in {} for the cgroup parent {} (a cgroup that holds "
            "processes cannot: choose a runtime.ns.cgroup_parent whose ancestors hold none)",
            d, env_.parent));
      }
    }
    setup_done_ = true;
    return absl::OkStatus();
  }

  static std::string Trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }
  static bool HasAll(const std::set<std::string>& enabled) {
    return std::all_of(std::begin(kNeeded), std::end(kNeeded),
                       [&](const char* c) { return enabled.count(c) > 0; });
  }

  CgroupEnv env_;
  std::string own_;
  std::string mount_;
  std::string base_;    // where controllers must be available: sbxd's cgroup, or the parent
  std::string parent_;  // holds the sandbox cgroups
  std::set<std::string> available_;
  bool setup_done_ = false;
};

}  // namespace

std::unique_ptr<CgroupDriver> MakeV2Driver(const CgroupLayout& layout, const CgroupEnv& env) {
  return std::make_unique<V2Driver>(layout, env);
}

}  // namespace sbx::runtime::ns
