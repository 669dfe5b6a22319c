#include "runtime/ns/landlock.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace sbx::runtime::ns {

namespace {

// Debian 12's uapi headers (linux-libc-dev 6.1) stop at ABI 2-3: struct landlock_ruleset_attr
// has only handled_access_fs. The kernel's ABI 6 layout and scope bits, from
// include/uapi/linux/landlock.h of Linux 6.12; the kernel accepts a smaller struct from older
// callers, and this one is passed only when the kernel reports ABI >= 6.
struct RulesetAttrV6 {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;  // ABI >= 4
  uint64_t scoped;              // ABI >= 6
};
constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0;  // LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
constexpr uint64_t kScopeSignal = 1ULL << 1;              // LANDLOCK_SCOPE_SIGNAL
constexpr int kScopeMinAbi = 6;
constexpr int kReferMinAbi = 2;  // LANDLOCK_ACCESS_FS_REFER

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

int g_probe_errno = 0;

}  // namespace

int LandlockAbi() {
  static const int kAbi = [] {
    long abi = ::syscall(__NR_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0) {
      g_probe_errno = errno;
      return 0;
    }
    return static_cast<int>(abi);
  }();
  return kAbi;
}

LandlockPlan BuildLandlockPlan(std::string* why_not) {
  LandlockPlan plan;
  const int abi = LandlockAbi();
  if (abi <= 0) {
    if (why_not != nullptr) {
      *why_not = fmt::format("landlock_create_ruleset(VERSION): {} ({})",
                             g_probe_errno == EOPNOTSUPP ? "disabled at boot" : "not in this kernel",
                             std::strerror(g_probe_errno));
    }
    return plan;
  }
  if (abi < kReferMinAbi) {
    // ABI 1 denies every cross-directory rename/link and cannot grant REFER: workloads break.
    if (why_not != nullptr) *why_not = fmt::format("Landlock ABI {} cannot allow cross-directory renames", abi);
    return plan;
  }
  plan.abi = abi;
  plan.handled_fs = LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_REFER;
  plan.refer_beneath_root = LANDLOCK_ACCESS_FS_REFER;
  if (abi >= kScopeMinAbi) plan.scoped = kScopeAbstractUnixSocket | kScopeSignal;
  return plan;
}

std::string DescribeLandlockPlan(const LandlockPlan& plan) {
  if (plan.abi == 0) {
    std::string why;
    BuildLandlockPlan(&why);
    return fmt::format("Landlock not used: {}", why.empty() ? "no plan" : why);
  }
  return fmt::format("Landlock ABI {}: device nodes denied{}", plan.abi,
                     plan.scoped != 0 ? "; signals and abstract unix sockets scoped to the sandbox" : "");
}

int ApplyLandlock(const LandlockPlan& plan) {
  if (plan.abi == 0) return 0;
  RulesetAttrV6 attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.handled_access_fs = plan.handled_fs;
  attr.scoped = plan.scoped;
  // Older kernels reject a larger struct whose unknown tail is non-zero; pass only what the
  // plan uses.
  const size_t size = plan.scoped != 0 ? sizeof(attr) : sizeof(attr.handled_access_fs);
  const int ruleset = static_cast<int>(::syscall(__NR_landlock_create_ruleset, &attr, size, 0));
  if (ruleset < 0) return errno;
  int err = 0;
  if (plan.refer_beneath_root != 0) {
    const int root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
      err = errno;
    } else {
      struct landlock_path_beneath_attr rule;
      std::memset(&rule, 0, sizeof(rule));
      rule.allowed_access = plan.refer_beneath_root;
      rule.parent_fd = root;
      if (::syscall(__NR_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0) err = errno;
      ::close(root);
    }
  }
  if (err == 0 && ::syscall(__NR_landlock_restrict_self, ruleset, 0) != 0) err = errno;
  ::close(ruleset);
  return err;
}

}  // namespace sbx::runtime::ns
