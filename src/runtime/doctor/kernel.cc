// kernel.version (the release against the features the runtimes use) and kernel.syscalls (the
// launch's syscalls, probed without side effects).
#include <sys/utsname.h>

#include <cstdio>

#include <fmt/format.h>

#include "runtime/doctor/checks.h"
#include "runtime/ns/launcher.h"

namespace sbx::runtime::doctor {

std::optional<KernelVersion> ParseKernelRelease(const std::string& release) {
  KernelVersion v;
  int used = 0;
  if (std::sscanf(release.c_str(), "%d.%d%n", &v.major, &v.minor, &used) != 2 || v.major <= 0) {
    return std::nullopt;
  }
  if (release.size() > static_cast<size_t>(used) && release[used] == '.') {
    std::sscanf(release.c_str() + used + 1, "%d", &v.patch);
  }
  return v;
}

const std::vector<KernelFeature>& KernelFeatures() {
  static const std::vector<KernelFeature> kFeatures = {
      {"clone3", 5, 3, "launching the agent", KernelFeature::kNs},
      {"pidfd_open", 5, 3, "tracking and killing the agent", KernelFeature::kNs},
      {"CLONE_NEWTIME", 5, 6, "the sandbox's time namespace", KernelFeature::kNs},
      {"CLONE_INTO_CGROUP", 5, 7, "starting the agent inside its v2 cgroup", KernelFeature::kNs},
      {"close_range(CLOSE_RANGE_CLOEXEC)", 5, 11, "closing sbxd's fds before the agent runs (close_range itself: 5.9)",
       KernelFeature::kNs},
      {"open_tree/mount_setattr(MOUNT_ATTR_IDMAP)", 5, 12, "idmapped template and binds (user namespaces)",
       KernelFeature::kNsUserns},
      {"cgroup.kill", 5, 14, "killing a sandbox's cgroup in one write (older: per-pid kill)",
       KernelFeature::kOptional},
      {"Landlock REFER (ABI 2)", 5, 19, "Landlock rules (device nodes denied)", KernelFeature::kOptional},
  };
  return kFeatures;
}

namespace {

std::string FeatureText(const KernelFeature& f) {
  return fmt::format("{} ({}.{}: {})", f.name, f.major, f.minor, f.used_for);
}

void CheckVersion(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  std::string release;
  if (auto text = ctx.Read("/proc/sys/kernel/osrelease"); text.ok()) {
    release = *text;
  } else if (struct utsname u; ctx.live && ::uname(&u) == 0) {
    release = u.release;
  }
  while (!release.empty() && (release.back() == '\n' || release.back() == ' ')) release.pop_back();
  Check c{"kernel.version", "kernel version", CheckResult::kOk, "", "", required};
  auto v = ParseKernelRelease(release);
  if (!v) {
    c.result = CheckResult::kWarn;
    c.detail = release.empty() ? fmt::format("cannot read {}", ctx.Host("/proc/sys/kernel/osrelease"))
                               : fmt::format("cannot parse the release \"{}\"", release);
    c.remedy = "make /proc/sys/kernel/osrelease readable; the other rows still probe each feature";
    ctx.Add(std::move(c));
    return;
  }
  std::vector<std::string> missing_required, missing_optional;
  int need_major = 0, need_minor = 0;
  for (const auto& f : KernelFeatures()) {
    const bool needed = ctx.ns && (f.need == KernelFeature::kNs ||
                                   (f.need == KernelFeature::kNsUserns && ctx.opts.user_namespaces));
    if (needed && (f.major > need_major || (f.major == need_major && f.minor > need_minor))) {
      need_major = f.major;
      need_minor = f.minor;
    }
    if (v->AtLeast(f.major, f.minor)) continue;
    (needed ? missing_required : missing_optional).push_back(FeatureText(f));
  }
  const std::string head = fmt::format("Linux {}", release);
  if (!missing_required.empty()) {
    c.result = CheckResult::kFail;
    std::string list;
    for (const auto& m : missing_required) list += (list.empty() ? "" : "; ") + m;
    c.detail = fmt::format("{} is older than {}.{}, which the ns runtime needs: missing {}", head,
                           need_major, need_minor, list);
    c.remedy = fmt::format("boot Linux {}.{} or newer{}", need_major, need_minor,
                           ctx.opts.user_namespaces ? " (5.11 is enough with --userns=false, weaker)" : "");
  } else if (!missing_optional.empty()) {
    c.result = CheckResult::kWarn;
    std::string list;
    for (const auto& m : missing_optional) list += (list.empty() ? "" : "; ") + m;
    c.detail = fmt::format("{}: enough for the {} runtime; without {}", head, ctx.opts.runtime, list);
    c.remedy = "optional: a newer kernel adds these";
  } else if (ctx.ns) {
    c.detail = fmt::format("{}: has every feature the ns runtime uses (clone3 5.3, CLONE_NEWTIME 5.6, "
                           "CLONE_INTO_CGROUP 5.7, close_range CLOEXEC 5.11, idmapped mounts 5.12, "
                           "cgroup.kill 5.14)", head);
  } else {
    c.detail = fmt::format("{}: the fake runtime needs no particular kernel", head);
  }
  ctx.Add(std::move(c));
}

void CheckSyscalls(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  if (!ctx.live) return ctx.AddNotProbed("kernel.syscalls", "launch syscalls", required);
  Check c{"kernel.syscalls", "launch syscalls", CheckResult::kOk, "", "", required};
  std::vector<std::string> problems;
  for (const absl::Status& st : {ns::ProbeClone3(), ns::ProbeCloseRangeCloexec()}) {
    if (!st.ok()) problems.push_back(std::string(st.message()));
  }
  if (problems.empty()) {
    c.detail = "clone3 and close_range(CLOSE_RANGE_CLOEXEC) answer (probed with no effect)";
  } else {
    c.result = CheckResult::kFail;
    for (const auto& p : problems) c.detail += (c.detail.empty() ? "" : "; ") + p;
    c.remedy = "boot Linux 5.11 or newer; if the kernel is new enough, a seccomp profile around sbxd "
               "(container runtime, systemd SystemCallFilter=) must allow clone3 and close_range";
  }
  ctx.Add(std::move(c));
}

}  // namespace

void CheckKernel(const Context& ctx) {
  CheckVersion(ctx);
  CheckSyscalls(ctx);
}

}  // namespace sbx::runtime::doctor
