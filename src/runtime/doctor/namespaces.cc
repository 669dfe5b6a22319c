// namespace.<type>: each namespace type the launch creates, present in /proc/self/ns and
// actually created (unshare) in a throwaway child; namespace.limits: /proc/sys/user/max_*.
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "runtime/doctor/checks.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

namespace sbx::runtime::doctor {

namespace {

struct NsType {
  const char* file;  // /proc/self/ns/<file>, /proc/sys/user/max_<file>_namespaces
  const char* title;
  int flag;
  const char* flag_name;
  const char* used_for;
  const char* config;  // the kernel option that provides it
};

// The user namespace last: once the child is in a new one, it has no privilege over the
// host's, and the namespaces after it would be created from there.
constexpr NsType kTypes[] = {
    {"mnt", "mount namespace", CLONE_NEWNS, "CLONE_NEWNS", "the sandbox's own mount table and root", "CONFIG_NAMESPACES"},
    {"pid", "pid namespace", CLONE_NEWPID, "CLONE_NEWPID", "the agent as PID 1", "CONFIG_PID_NS"},
    {"net", "network namespace", CLONE_NEWNET, "CLONE_NEWNET", "a network with only lo", "CONFIG_NET_NS"},
    {"ipc", "ipc namespace", CLONE_NEWIPC, "CLONE_NEWIPC", "private SysV IPC and POSIX queues", "CONFIG_IPC_NS"},
    {"uts", "uts namespace", CLONE_NEWUTS, "CLONE_NEWUTS", "the sandbox's hostname", "CONFIG_UTS_NS"},
    {"cgroup", "cgroup namespace", CLONE_NEWCGROUP, "CLONE_NEWCGROUP", "hiding the host's cgroup paths", "CONFIG_CGROUPS"},
    {"time", "time namespace", CLONE_NEWTIME, "CLONE_NEWTIME", "the sandbox's own boot/monotonic clocks", "CONFIG_TIME_NS"},
    {"user", "user namespace", CLONE_NEWUSER, "CLONE_NEWUSER", "sandbox root as an unprivileged host uid", "CONFIG_USER_NS"},
};
constexpr size_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

bool Required(const Context& ctx, const NsType& t) {
  if (!ctx.ns) return false;
  return t.flag != CLONE_NEWUSER || ctx.opts.user_namespaces;
}

std::string NsRemedy(const NsType& t, int err) {
  if (err == EINVAL) return fmt::format("the kernel lacks {}: use a kernel built with it", t.config);
  if (err == ENOSPC) {
    return fmt::format("the limit /proc/sys/user/max_{}_namespaces is reached: raise it "
                       "(sysctl user.max_{}_namespaces=...)", t.file, t.file);
  }
  if (err == EPERM) {
    return "run as root (sbxd needs CAP_SYS_ADMIN in the host's user namespace); inside a "
           "container, its seccomp/AppArmor profile must allow unshare";
  }
  if (err == EUSERS) return "too many nested user namespaces: run sbxd from the host's own";
  return "see the errno above";
}

void CheckTypes(const Context& ctx) {
  int errs[kNumTypes];
  bool probed = false;
  std::string probe_problem;
  bool any_wanted = false;
  for (const auto& t : kTypes) any_wanted = any_wanted || ctx.Wants(Required(ctx, t));
  if (!any_wanted) return;
  if (ctx.live) {
    // One child creates each type in turn and reports the errno of each: one fork, not eight.
    auto outcome = RunInChild(
        [](int fd) {
          int results[kNumTypes];
          for (size_t i = 0; i < kNumTypes; ++i) {
            results[i] = ::unshare(kTypes[i].flag) == 0 ? 0 : errno;
          }
          (void)!::write(fd, results, sizeof(results));
        },
        ctx.opts.probe_timeout);
    if (!outcome.ok()) {
      probe_problem = std::string(outcome.status().message());
    } else if (outcome->output.size() != sizeof(errs)) {
      probe_problem = DescribeAbnormal(*outcome, ctx.opts.probe_timeout);
      if (probe_problem.empty()) probe_problem = "the probe process reported nothing";
    } else {
      std::memcpy(errs, outcome->output.data(), sizeof(errs));
      probed = true;
    }
  }
  for (size_t i = 0; i < kNumTypes; ++i) {
    const NsType& t = kTypes[i];
    const bool required = Required(ctx, t);
    if (!ctx.Wants(required)) continue;
    Check c{fmt::format("namespace.{}", t.file), t.title, CheckResult::kOk, "", "", required};
    const std::string file = fmt::format("/proc/self/ns/{}", t.file);
    const bool present = ctx.Exists(file);
    if (!present) {
      c.result = required ? CheckResult::kFail : CheckResult::kWarn;
      c.detail = fmt::format("{} is missing: the kernel has no {} ({})", ctx.Host(file), t.title, t.used_for);
      c.remedy = NsRemedy(t, EINVAL);
    } else if (!ctx.live) {
      c.detail = fmt::format("{} present; not created: fake host root", ctx.Host(file));
    } else if (!probed) {
      c.result = required ? CheckResult::kFail : CheckResult::kWarn;
      c.detail = fmt::format("{} present, but the unshare probe failed: {}", file, probe_problem);
      c.remedy = "see the error; run as root";
    } else if (errs[i] == 0) {
      c.detail = fmt::format("created one in a child: unshare({}) ok", t.flag_name);
    } else {
      c.result = required ? CheckResult::kFail : CheckResult::kWarn;
      c.detail = fmt::format("unshare({}) in a child failed: {} ({} needs it: {})", t.flag_name,
                             ErrnoText(errs[i]), ctx.opts.runtime, t.used_for);
      c.remedy = NsRemedy(t, errs[i]);
    }
    if (!required && c.result == CheckResult::kOk && t.flag == CLONE_NEWUSER && ctx.ns) {
      c.detail += " (not used: --userns=false)";
    }
    ctx.Add(std::move(c));
  }
}

void CheckLimits(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{"namespace.limits", "namespace limits", CheckResult::kOk, "", "", required};
  std::vector<std::string> zero, low, values;
  for (const auto& t : kTypes) {
    const std::string path = fmt::format("/proc/sys/user/max_{}_namespaces", t.file);
    auto text = ctx.Read(path);
    if (!text.ok()) continue;  // older kernels lack some (max_time_namespaces: 5.6)
    const long v = std::strtol(text->c_str(), nullptr, 10);
    values.push_back(fmt::format("{} {}", t.file, v));
    if (!Required(ctx, t)) continue;
    if (v == 0) {
      zero.push_back(fmt::format("user.max_{}_namespaces", t.file));
    } else if (v < kLowNamespaceLimit) {
      low.push_back(fmt::format("user.max_{}_namespaces={}", t.file, v));
    }
  }
  std::string notes;
  // Debian's and Ubuntu's switches for unprivileged users: they do not restrict root.
  if (auto v = ctx.Read("/proc/sys/kernel/unprivileged_userns_clone"); v.ok()) {
    notes += fmt::format("; kernel.unprivileged_userns_clone={} (limits unprivileged users only; "
                         "sbxd runs as root)", std::strtol(v->c_str(), nullptr, 10));
  }
  if (auto v = ctx.Read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); v.ok()) {
    notes += fmt::format("; kernel.apparmor_restrict_unprivileged_userns={} (unprivileged users only)",
                         std::strtol(v->c_str(), nullptr, 10));
  }
  std::string list;
  for (const auto& v : values) list += (list.empty() ? "" : ", ") + v;
  if (values.empty()) {
    c.result = CheckResult::kWarn;
    c.detail = fmt::format("cannot read {}/max_*_namespaces", ctx.Host("/proc/sys/user"));
    c.remedy = "mount /proc; the namespace rows above still probe creation";
  } else if (!zero.empty()) {
    c.result = CheckResult::kFail;
    std::string z;
    for (const auto& s : zero) z += (z.empty() ? "" : ", ") + s;
    c.detail = fmt::format("{} is 0: no such namespace can be created (max per user: {}){}", z, list, notes);
    c.remedy = fmt::format("raise it, e.g. sysctl -w {}=65536 (and in /etc/sysctl.d/)", zero.front());
  } else if (!low.empty()) {
    c.result = CheckResult::kWarn;
    std::string l;
    for (const auto& s : low) l += (l.empty() ? "" : ", ") + s;
    c.detail = fmt::format("low: {}: each sandbox holds one of each type and the user/netns pools "
                           "hold a few more, so creates fail past that (max per user: {}){}",
                           l, list, notes);
    c.remedy = fmt::format("raise them to at least {} (sysctl -w user.max_..._namespaces=N)", kLowNamespaceLimit);
  } else {
    c.detail = fmt::format("max per user: {}{}", list, notes);
  }
  ctx.Add(std::move(c));
}

}  // namespace

void CheckNamespaces(const Context& ctx) {
  CheckTypes(ctx);
  CheckLimits(ctx);
}

}  // namespace sbx::runtime::doctor
