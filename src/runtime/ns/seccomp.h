// The sandbox's seccomp filter: built ONCE per backend in the parent with libseccomp, exported
// as classic BPF, and installed in each child with a bare prctl (no allocation after clone).
//
// It is a deny-list (default allow) that returns EPERM for syscalls that administer the host or
// the kernel, or that open attack surface namespaces cannot contain; see seccomp.cc for the list.
// clone3 returns ENOSYS so that libc falls back to clone(), whose flags a classic BPF filter can
// inspect (clone3 passes them in memory).
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

struct SeccompProgram {
  // Produced by libseccomp: the deny-list and the clone flag checks.
  std::vector<sock_filter> main;
  // Hand-written: personality() only with 0, PER_LINUX32 (8) or 0xffffffff (query). libseccomp
  // cannot express "arg not in {a, b, c}" (several comparisons of one argument in one rule).
  std::vector<sock_filter> personality;
};

// Names of the syscalls that fail with EPERM (for docs and tests).
const std::vector<std::string>& SeccompDeniedSyscalls();

absl::StatusOr<SeccompProgram> BuildSeccompProgram();

// Child side (async-signal-safe): installs both filters. Needs PR_SET_NO_NEW_PRIVS or
// CAP_SYS_ADMIN. Returns 0 or an errno value.
int InstallSeccomp(const SeccompProgram& prog);

}  // namespace sbx::runtime::ns
