// Who the processes the agent starts are.
//
// On the ns runtime with user namespaces the agent is not sandbox root: it stays in the host's
// user namespace as the unprivileged uid that owns the sandbox's user namespace
// (runtime/ns/userns.h), with no capabilities. Nothing sandbox root can become shares its
// credentials, so sandbox root cannot signal, prlimit, renice, ptrace or OOM-adjust it, and its
// /proc/1 files belong to host root. Every session process and file worker therefore enters
// the sandbox's identity itself, between fork and exec:
//   1. join the sandbox's cgroups (work/, beside the agent's own) and a cgroup namespace,
//   2. setns into the sandbox's user namespace (the agent owns it: every capability there),
//   3. cut the capabilities to the sandbox's set, switch to the session's user,
//   4. stack a filter that denies setns and unshare again (the agent's own seccomp filter is
//      the sandbox's plus those two, see runtime/ns/seccomp.h SeccompFor::kAgent).
// Without a user namespace fd (the fake runtime, --userns=false) the agent's own credentials
// are the sandbox's and only the user switch happens, as before.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capset.h"

namespace sbx::agent {

struct SandboxIdentity {
  int userns_fd = -1;  // -1: no user namespace to enter
  CapsPlan caps;       // what sandbox root keeps (with userns_fd)
  // cgroup.procs files (opened by sbxd, so writable whatever our credentials) of the cgroups
  // sandbox processes belong in; empty: stay in the agent's.
  std::vector<int> cgroup_procs_fds;
  std::vector<sock_filter> child_filter;  // with userns_fd: denies setns and unshare
  // The namespace's uid map (0..uid_count-1 inside = uid_base.. on the host), for reading the
  // host's view of a sandbox process's ids (/proc/<pid>/status) the way the sandbox sees them.
  uint32_t uid_base = 0;
  uint32_t uid_count = 0;

  // A host uid/gid as the sandbox sees it: 65534 (the kernel's overflow id) when unmapped.
  int64_t ToSandboxId(int64_t host_id) const {
    if (userns_fd < 0) return host_id;
    if (host_id >= uid_base && host_id < int64_t{uid_base} + uid_count) return host_id - uid_base;
    return 65534;
  }
};

// Builds the child filter (no-op when identity has no userns_fd). Call once, at start-up.
absl::Status PrepareIdentity(SandboxIdentity* identity);

// Parses "0x..." or decimal capability masks (--caps). The highest capability number is read
// from /proc/sys/kernel/cap_last_cap when present.
absl::StatusOr<CapsPlan> ParseCapsMask(const char* text);

// Child side, async-signal-safe: everything above, ending as uid/gid with `groups`. Returns 0
// or an errno value, with *step naming the failed step (a static string).
int EnterSandbox(const SandboxIdentity& identity, bool switch_user, uid_t uid, gid_t gid,
                 const gid_t* groups, size_t ngroups, const char** step);

}  // namespace sbx::agent
