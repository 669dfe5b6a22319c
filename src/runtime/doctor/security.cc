// security.privileges (root with CAP_SYS_ADMIN), security.capabilities (the sandbox's capability
// mask), seccomp.kernel (the filter actions the policy uses), seccomp.policy (our policy
// compiled with the runtime's own code and installed in a throwaway child), landlock (the ABI,
// and the runtime's plan applied in that same child).
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <fmt/format.h>

#include "runtime/doctor/checks.h"
#include "runtime/ns/caps.h"
#include "runtime/ns/landlock.h"
#include "runtime/ns/seccomp.h"

namespace sbx::runtime::doctor {

namespace {

constexpr int kCapSysAdmin = 21;

// "Uid:" (effective is the second number) and "CapEff:" of <root>/proc/self/status.
void CheckPrivileges(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{"security.privileges", "root with CAP_SYS_ADMIN", CheckResult::kOk, "", "", required};
  auto status = ctx.Read("/proc/self/status");
  if (!status.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(status.status().message());
    c.remedy = "mount /proc";
    ctx.Add(std::move(c));
    return;
  }
  long euid = -1;
  unsigned long long cap_eff = 0;
  bool have_caps = false;
  std::istringstream is(*status);
  for (std::string line; std::getline(is, line);) {
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream ls(line.substr(4));
      long real = -1;
      ls >> real >> euid;
    } else if (line.rfind("CapEff:", 0) == 0) {
      cap_eff = std::strtoull(line.c_str() + 7, nullptr, 16);
      have_caps = true;
    }
  }
  const bool sys_admin = have_caps && (cap_eff >> kCapSysAdmin & 1) != 0;
  if (euid != 0 || !sys_admin) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("this process runs as uid {}{}: the ns runtime mounts, and creates "
                           "namespaces, cgroups and loop devices", euid,
                           sys_admin ? "" : " without CAP_SYS_ADMIN");
    c.remedy = "run sbxd (and sbx doctor) as root, or pick --runtime fake (no isolation)";
  } else {
    c.detail = fmt::format("uid 0 with CAP_SYS_ADMIN (CapEff {:016x})", cap_eff);
  }
  ctx.Add(std::move(c));
}

void CheckCaps(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  if (!ctx.live) return ctx.AddNotProbed("security.capabilities", "sandbox capability set", required);
  Check c{"security.capabilities", "sandbox capability set", CheckResult::kOk, "", "", required};
  auto plan = ns::BuildCapsPlan();
  if (!plan.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(plan.status().message());
    c.remedy = "make /proc/sys/kernel/cap_last_cap readable; reinstall libcap2";
  } else {
    c.detail = fmt::format("{} capabilities kept of {} the kernel knows (Docker's default set "
                           "minus NET_RAW and MKNOD)",
                           ns::SandboxCapabilityNames().size(), plan->last_cap + 1);
  }
  ctx.Add(std::move(c));
}

void CheckSeccompKernel(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{"seccomp.kernel", "seccomp filters", CheckResult::kOk, "", "", required};
  const std::string path = "/proc/sys/kernel/seccomp/actions_avail";
  auto text = ctx.Read(path);
  if (!text.ok()) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("{}: no seccomp filter support (CONFIG_SECCOMP_FILTER, Linux 4.14+ for "
                           "actions_avail)", std::string(text.status().message()));
    c.remedy = "use a kernel built with CONFIG_SECCOMP and CONFIG_SECCOMP_FILTER";
  } else {
    std::istringstream is(*text);
    std::vector<std::string> actions;
    for (std::string w; is >> w;) actions.push_back(w);
    std::vector<std::string> missing;
    for (const char* need : {"allow", "errno"}) {
      if (std::find(actions.begin(), actions.end(), need) == actions.end()) missing.push_back(need);
    }
    std::string all;
    for (const auto& a : actions) all += (all.empty() ? "" : " ") + a;
    if (!missing.empty()) {
      c.result = CheckResult::kFail;
      c.detail = fmt::format("actions_avail \"{}\" lacks {}: the policy answers denied syscalls with "
                             "ERRNO", all, missing.front());
      c.remedy = "use a kernel with full seccomp filter support";
    } else {
      c.detail = fmt::format("actions: {}", all);
    }
  }
  ctx.Add(std::move(c));
}

// One child: no_new_privs, the Landlock plan, the seccomp filter; reports both errnos.
struct ApplyResult {
  int landlock_err = 0;
  int seccomp_err = 0;
};

void CheckPolicyAndLandlock(const Context& ctx) {
  const bool seccomp_required = ctx.ns;
  const bool want_seccomp = ctx.Wants(seccomp_required);
  const bool want_landlock = ctx.Wants(false);
  if (!want_seccomp && !want_landlock) return;

  Check pol{"seccomp.policy", "seccomp policy", CheckResult::kOk, "", "", seccomp_required};
  const bool custom = !ctx.opts.seccomp_policy_path.empty();
  auto prog = custom ? ns::BuildSeccompProgramFromFile(ctx.opts.seccomp_policy_path)
                     : ns::BuildSeccompProgram();
  ns::LandlockPlan plan;
  std::string why_not;
  if (ctx.live) plan = ns::BuildLandlockPlan(&why_not);

  ApplyResult applied;
  std::string child_problem;
  bool ran = false;
  if (ctx.live && (prog.ok() || plan.abi > 0)) {
    const ns::SeccompProgram* p = prog.ok() ? &*prog : nullptr;
    auto outcome = RunInChild(
        [p, &plan](int fd) {
          ApplyResult r;
          if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
            r.landlock_err = r.seccomp_err = errno;
          } else {
            r.landlock_err = ns::ApplyLandlock(plan);
            r.seccomp_err = p != nullptr ? ns::InstallSeccomp(*p) : 0;
          }
          (void)!::write(fd, &r, sizeof(r));
        },
        ctx.opts.probe_timeout);
    if (!outcome.ok()) {
      child_problem = std::string(outcome.status().message());
    } else if (outcome->output.size() != sizeof(applied)) {
      child_problem = DescribeAbnormal(*outcome, ctx.opts.probe_timeout);
      if (child_problem.empty()) child_problem = "the probe process reported nothing";
    } else {
      std::memcpy(&applied, outcome->output.data(), sizeof(applied));
      ran = true;
    }
  }

  if (want_seccomp) {
    const std::string source = custom ? ctx.opts.seccomp_policy_path : "the embedded policy";
    if (!prog.ok()) {
      pol.result = CheckResult::kFail;
      pol.detail = std::string(prog.status().message());
      pol.remedy = custom ? "fix the policy file (format: src/runtime/ns/seccomp_policy.json)"
                          : "rebuild sbx: the embedded policy does not compile with this libseccomp";
    } else {
      const std::string size = fmt::format("{} compiled: {} + {} BPF instructions{}", source,
                                           prog->main.size(), prog->handwritten.size(),
                                           prog->skipped.empty() ? ""
                                               : fmt::format(", {} names unknown to libseccomp here skipped",
                                                             prog->skipped.size()));
      if (!ctx.live) {
        pol.detail = size + "; not installed: fake host root";
      } else if (!ran) {
        pol.result = CheckResult::kFail;
        pol.detail = fmt::format("{}; installing it in a child failed: {}", size, child_problem);
        pol.remedy = "see the error";
      } else if (applied.seccomp_err != 0) {
        pol.result = CheckResult::kFail;
        pol.detail = fmt::format("{}; prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER) in a child failed: {}",
                                 size, ErrnoText(applied.seccomp_err));
        pol.remedy = applied.seccomp_err == EINVAL
                         ? "the kernel rejects the filter: use a kernel with CONFIG_SECCOMP_FILTER"
                         : "see the errno; a seccomp profile around sbxd may forbid stacking filters";
      } else {
        pol.detail = size + "; installed in a child";
      }
    }
    ctx.Add(std::move(pol));
  }

  if (want_landlock) {
    Check ll{"landlock", "Landlock", CheckResult::kOk, "", "", false};
    if (!ctx.live) {
      ll.result = CheckResult::kSkip;
      ll.detail = "not probed: fake host root (" + ctx.opts.host_root + ")";
    } else if (plan.abi == 0) {
      ll.result = CheckResult::kWarn;
      ll.detail = fmt::format("{} (kernel ABI {}): sandboxes run without this second line "
                              "(device nodes could be made by a process that regained CAP_MKNOD)",
                              ns::DescribeLandlockPlan(plan), ns::LandlockAbi());
      ll.remedy = "optional: Linux 5.19+ with landlock in the lsm= boot parameter (CONFIG_SECURITY_LANDLOCK)";
    } else if (!ran || applied.landlock_err != 0) {
      ll.result = CheckResult::kWarn;
      ll.detail = fmt::format("ABI {}, but applying the plan in a child failed: {}", plan.abi,
                              ran ? ErrnoText(applied.landlock_err) : child_problem);
      ll.remedy = "see the errno; sandbox launches would fail the same way";
    } else {
      ll.detail = fmt::format("{}; applied in a child", ns::DescribeLandlockPlan(plan));
      if (plan.scoped == 0) {
        ll.result = CheckResult::kWarn;
        ll.detail += " (ABI < 6: signals and abstract unix sockets not scoped)";
        ll.remedy = "optional: Linux 6.12+ scopes signals and abstract unix sockets";
      }
    }
    ctx.Add(std::move(ll));
  }
}

}  // namespace

void CheckSecurity(const Context& ctx) {
  CheckPrivileges(ctx);
  CheckCaps(ctx);
  CheckSeccompKernel(ctx);
  CheckPolicyAndLandlock(ctx);
}

}  // namespace sbx::runtime::doctor
