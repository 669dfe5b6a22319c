// Landlock for the sandbox: a second line behind namespaces and capabilities, applied in the
// launch child after PR_SET_NO_NEW_PRIVS and before seccomp.
//
// The ruleset is deliberately narrow so that no workload breaks:
//  * filesystem: handles MAKE_CHAR and MAKE_BLOCK, and no rule grants them, so creating a
//    device node is denied everywhere (even to a process that regained CAP_MKNOD);
//  * REFER (rename/link into another directory) is denied by any Landlock ruleset unless a rule
//    grants it, so the ruleset handles REFER and grants it beneath "/" to keep `mv`, pip and
//    compilers working. ABI 1 cannot grant REFER: Landlock is then not used at all;
//  * ABI >= 6: scopes SIGNAL and ABSTRACT_UNIX_SOCKET, so sandbox processes can signal and
//    connect (abstract unix sockets) only within the sandbox's own Landlock domain.
// The probe runs once in the parent; without Landlock (ENOSYS/EOPNOTSUPP, or ABI 1) launches
// carry on without it.
#pragma once

#include <cstdint>
#include <string>

namespace sbx::runtime::ns {

struct LandlockPlan {
  int abi = 0;                 // 0: Landlock is not used
  uint64_t handled_fs = 0;     // landlock_ruleset_attr.handled_access_fs
  uint64_t scoped = 0;         // landlock_ruleset_attr.scoped (ABI >= 6)
  uint64_t refer_beneath_root = 0;  // rights the rule on "/" grants (REFER)
};

// landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION), asked once per process:
// the ABI version, or 0 when the kernel has no Landlock or it is disabled.
int LandlockAbi();

// The plan for this kernel (abi 0 when Landlock is unavailable or too old). `why_not` receives
// a one-line reason when the plan is empty, for the startup log and the backend's probe.
LandlockPlan BuildLandlockPlan(std::string* why_not = nullptr);

// A description for logs and reports, e.g. "Landlock ABI 7: no device nodes, scoped signals
// and abstract unix sockets" or "Landlock unavailable (ENOSYS)".
std::string DescribeLandlockPlan(const LandlockPlan& plan);

// Child side (async-signal-safe, syscalls only): creates the ruleset, adds the REFER rule on
// "/" (the sandbox's root at that point) and restricts the calling thread. Needs
// PR_SET_NO_NEW_PRIVS or CAP_SYS_ADMIN. Returns 0 (also when plan.abi is 0) or an errno value.
int ApplyLandlock(const LandlockPlan& plan);

}  // namespace sbx::runtime::ns
