// The sandbox's seccomp filter: an allow-list kept as reviewed data (seccomp_policy.json, whose
// "_doc" key documents the format), embedded into the binary at build time. It is compiled ONCE
// per backend in the parent (libseccomp, exported as classic BPF, plus a small hand-written
// program) and installed in each child with bare prctl calls (no allocation after clone).
//
// Every syscall not allowed fails with ERRNO(EPERM) (never a kill, for compatibility); syscalls
// newer than the review (numbers >= enosys_from_nr) fail with ENOSYS so that libc falls back.
// clone3 returns ENOSYS so that libc falls back to clone(), whose flags a classic BPF filter can
// inspect (clone3 passes them in memory). docs/isolation.md §5.1 explains each
// denial and how to change the policy.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

// The parsed policy file (validated: names well-formed, no name in two lists).
struct SeccompPolicy {
  enum class Op { kEq, kNe, kLt, kLe, kGt, kGe, kMaskedEq };
  struct Condition {
    unsigned arg = 0;  // 0..5
    Op op = Op::kEq;
    uint64_t value = 0;
    uint64_t mask = 0;  // kMaskedEq only
  };
  struct AllowIf {
    std::string name;
    std::vector<Condition> all;  // AND; several AllowIf of one name are OR
  };
  struct DenyArg0 {
    std::string name;
    std::vector<uint32_t> values;
  };
  struct ErrnoRule {
    std::string name;
    int err = 0;
  };

  int default_errno = 0;
  int enosys_from_nr = 0;  // 0 = no ENOSYS tail
  std::vector<std::string> allow;
  std::vector<AllowIf> allow_if;
  std::vector<DenyArg0> deny_arg0;
  std::vector<ErrnoRule> errno_rules;
  std::vector<std::string> deny;
  // socket(AF_NETLINK, *, protocol) only for these protocols; nullopt: any.
  std::optional<std::vector<uint32_t>> netlink_allow;
};

// Whose filter: the sandbox's processes, or the agent, which may also setns(CLONE_NEWUSER)
// and unshare(CLONE_NEWCGROUP) to start them (and whose children deny both again).
enum class SeccompFor { kSandbox, kAgent };

// Parses and validates a policy; errors name the offending entry, e.g.
// "seccomp policy: allow[12]: expected a syscall name (string), got 5".
absl::StatusOr<SeccompPolicy> ParseSeccompPolicy(const std::string& json_text);

// The policy embedded at build time (src/runtime/ns/seccomp_policy.json).
const std::string& EmbeddedSeccompPolicyJson();

struct SeccompProgram {
  // Produced by libseccomp: the allow-list, allow_if and errno rules, default_errno.
  std::vector<sock_filter> main;
  // Hand-written, installed after `main` so that its errno wins over main's default on a tie:
  // personality() only with 0, PER_LINUX32 (8) or 0xffffffff (query), deny_arg0 (32-bit
  // compares libseccomp cannot express: "arg not in {a, b}" takes several comparisons of one
  // argument in one rule), and ENOSYS for syscall numbers >= enosys_from_nr.
  std::vector<sock_filter> handwritten;
  // Policy names libseccomp does not know on this architecture (skipped with a warning).
  std::vector<std::string> skipped;
};

// Names the embedded policy denies explicitly ("deny"), for docs and tests. Empty only if the
// embedded policy is invalid (then BuildSeccompProgram fails).
const std::vector<std::string>& SeccompDeniedSyscalls();
// Names the embedded policy allows (allow + allow_if), sorted and unique.
const std::vector<std::string>& SeccompAllowedSyscalls();

// Compiles the embedded policy (once per process; later calls return a copy).
absl::StatusOr<SeccompProgram> BuildSeccompProgram(SeccompFor who = SeccompFor::kSandbox);
absl::StatusOr<SeccompProgram> BuildSeccompProgramFromPolicy(const std::string& json_text,
                                                             SeccompFor who = SeccompFor::kSandbox);
// Reads a policy file (sbxd --seccomp-policy); errors name the file.
absl::StatusOr<SeccompProgram> BuildSeccompProgramFromFile(const std::string& path,
                                                           SeccompFor who = SeccompFor::kSandbox);

// Child side (async-signal-safe): installs both filters. Needs PR_SET_NO_NEW_PRIVS or
// CAP_SYS_ADMIN. Returns 0 or an errno value.
int InstallSeccomp(const SeccompProgram& prog);

}  // namespace sbx::runtime::ns
