// cgroup.layout (v1, v2 or hybrid, and which driver the ns runtime would pick) and one row per
// controller: memory, pids and cpu are required by the ns runtime, the freezer (pause) is not.
// The layout comes from the runtime's own DetectCgroupLayout, read under the host root, so the
// doctor sees exactly what sbxd would.
#include <unistd.h>

#include <set>
#include <sstream>

#include <fmt/format.h>

#include "runtime/doctor/checks.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::doctor {

namespace {

using ns::CgroupLayout;
using ns::cgroup_internal::Join;

constexpr const char* kRequired[] = {"memory", "pids", "cpu"};

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The v2 cgroup whose controllers sandboxes need (cgroup_v2.cc): with a configured parent the
// hierarchy's root, where the parent's chain starts; else sbxd's own cgroup (a restarted sbxd
// already sits in its `sbxd` leaf, and the parent is the cgroup above it).
std::string V2Base(const CgroupLayout& layout, const std::string& parent) {
  if (!parent.empty()) return layout.v2_mount;
  std::string own = layout.v2_own.empty() ? "/" : layout.v2_own;
  size_t slash = own.rfind('/');
  if (slash != std::string::npos && own.substr(slash + 1) == ns::kCgroupDaemonLeaf) {
    own = slash == 0 ? "/" : own.substr(0, slash);
  }
  return Join(layout.v2_mount, own);
}

std::string Describe(const CgroupLayout& layout) {
  std::vector<std::string> parts;
  for (const auto& [key, h] : layout.v1) {
    parts.push_back(fmt::format("v1 {} at {} (own cgroup {})", key, h.mount, h.own.empty() ? "/" : h.own));
  }
  if (layout.has_v2) parts.push_back(fmt::format("v2 at {} (own cgroup {})", layout.v2_mount, layout.v2_own));
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : "; ") + p;
  return s;
}

void CheckController(const Context& ctx, const CgroupLayout& layout, const ns::CgroupEnv& env,
                     const char* controller) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{fmt::format("cgroup.{}", controller), fmt::format("{} controller", controller),
          CheckResult::kOk, "", "", required};
  const char* limit = std::string(controller) == "memory" ? "memory limit"
                      : std::string(controller) == "pids" ? "process-count limit"
                                                          : "CPU limit";
  if (layout.pure_v2()) {
    const std::string base = V2Base(layout, env.parent);
    const std::string sandboxes =
        env.parent.empty() ? Join(base, ns::kCgroupParentName) : Join(layout.v2_mount, env.parent);
    const std::string file = Join(base, "cgroup.controllers");
    auto text = ns::ReadFileToString(file);
    std::set<std::string> have;
    if (text.ok()) {
      std::istringstream is(*text);
      for (std::string w; is >> w;) have.insert(w);
    }
    if (!text.ok()) {
      c.result = CheckResult::kFail;
      c.detail = fmt::format("cgroup v2: {}", std::string(text.status().message()));
      c.remedy = "mount cgroup2 at /sys/fs/cgroup";
    } else if (have.count(controller) == 0) {
      c.result = CheckResult::kFail;
      c.detail = fmt::format("cgroup v2: '{}' is not in {} (\"{}\"), so the sandbox's {} cannot be "
                             "enforced", controller, file, Trim(*text), limit);
      c.remedy = fmt::format("delegate it to sbxd's cgroup: enable +{} in the parent's "
                             "cgroup.subtree_control (systemd: run sbxd as a service with Delegate=yes)",
                             controller);
    } else {
      c.detail = fmt::format("cgroup v2: available in {} (sandboxes go under {}{})", base, sandboxes,
                             env.parent.empty() ? "; this is the cgroup of the process running the "
                                                  "doctor, sbxd's may differ" : "");
    }
    ctx.Add(std::move(c));
    return;
  }
  auto driver = ns::MakeV1HybridDriver(layout, env);
  ns::CgroupLimits only;
  if (c.id == "cgroup.memory") only.memory_bytes = 1;
  if (c.id == "cgroup.pids") only.pids = 1;
  if (c.id == "cgroup.cpu") only.cpu_quota_us = 1;
  if (absl::Status st = driver->CheckLimits(only); !st.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(st.message());
    c.remedy = fmt::format("mount the v1 {0} controller (mount -t cgroup -o {0} cgroup "
                           "/sys/fs/cgroup/{0}), or boot with pure cgroup v2 "
                           "(systemd.unified_cgroup_hierarchy=1) with {0} delegated to sbxd",
                           controller);
    ctx.Add(std::move(c));
    return;
  }
  const auto& h = layout.v1.at(controller);
  const std::string dir = Join(h.mount, h.own);
  if (::access(dir.c_str(), F_OK) != 0) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("cgroup v1 {} is mounted at {}, but this process's cgroup {} does not exist there",
                           controller, h.mount, dir);
    c.remedy = "check /proc/self/cgroup against the mounts (a cgroup namespace or a partial bind mount?)";
  } else if (::access(dir.c_str(), W_OK) != 0) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("cgroup v1 {}: {} is not writable: {}", controller, dir, ErrnoText(errno));
    c.remedy = "run sbxd as root with a writable cgroupfs (a container needs its cgroups delegated, "
               "e.g. --cgroupns=private with a writable /sys/fs/cgroup)";
  } else {
    c.detail = fmt::format("cgroup v1 at {}: sandboxes go under {}", h.mount,
                           env.parent.empty() ? Join(dir, ns::kCgroupParentName) : Join(h.mount, env.parent));
  }
  ctx.Add(std::move(c));
}

void CheckFreezer(const Context& ctx, const CgroupLayout& layout) {
  if (!ctx.Wants(false)) return;
  Check c{"cgroup.freezer", "freezer (pause)", CheckResult::kOk, "", "", false};
  if (layout.has_v2) {
    c.detail = fmt::format("cgroup.freeze of the v2 hierarchy at {} (needs no controller)", layout.v2_mount);
  } else if (layout.v1.count(ns::kFreezerKey) > 0) {
    c.detail = fmt::format("v1 freezer at {} (polled freezer.state)", layout.v1.at(ns::kFreezerKey).mount);
  } else {
    c.result = CheckResult::kWarn;
    c.detail = "neither a cgroup v2 hierarchy nor the v1 freezer is mounted: pause, suspend and wake "
               "will be refused";
    c.remedy = "mount cgroup2 (e.g. at /sys/fs/cgroup/unified) or the v1 freezer controller";
  }
  ctx.Add(std::move(c));
}

}  // namespace

void CheckCgroups(const Context& ctx) {
  const bool required = ctx.ns;
  ns::CgroupEnv env;
  env.proc_root = ctx.Host("/proc");
  if (ctx.Host("/") != "/") env.cgroupfs_root = ctx.Host("/sys/fs/cgroup");
  env.parent = ctx.opts.cgroup_parent;
  auto layout = ns::DetectCgroupLayout(env);
  if (ctx.Wants(required)) {
    Check c{"cgroup.layout", "cgroup layout", CheckResult::kOk, "", "", required};
    if (absl::Status valid = ns::ValidateCgroupParent(env.parent); !valid.ok()) {
      c.result = required ? CheckResult::kFail : CheckResult::kWarn;
      c.detail = std::string(valid.message());
      c.remedy = "fix runtime.ns.cgroup_parent (docs/config.md)";
    } else if (!layout.ok()) {
      c.result = required ? CheckResult::kFail : CheckResult::kWarn;
      c.detail = std::string(layout.status().message());
      c.remedy = "mount cgroup2 at /sys/fs/cgroup (or the v1 memory, pids and cpu controllers)";
    } else {
      const char* kind = layout->pure_v2() ? "cgroup v2" : layout->has_v2 ? "hybrid v1+v2" : "cgroup v1";
      auto driver = layout->pure_v2() ? ns::MakeV2Driver(*layout, env) : ns::MakeV1HybridDriver(*layout, env);
      c.detail = fmt::format("{} (driver {}): {}", kind, driver->Name(), Describe(*layout));
    }
    ctx.Add(std::move(c));
  }
  if (!layout.ok()) {
    for (const char* controller : kRequired) {
      if (!ctx.Wants(required)) break;
      ctx.Add(Check{fmt::format("cgroup.{}", controller), fmt::format("{} controller", controller),
                    required ? CheckResult::kFail : CheckResult::kWarn, "no cgroup hierarchy is mounted",
                    "see cgroup.layout", required});
    }
    return;
  }
  for (const char* controller : kRequired) CheckController(ctx, *layout, env, controller);
  CheckFreezer(ctx, *layout);
}

}  // namespace sbx::runtime::doctor
