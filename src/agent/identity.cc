#include "agent/identity.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace sbx::agent {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "agent identity: unsupported architecture"
#endif

}  // namespace

absl::Status PrepareIdentity(SandboxIdentity* identity) {
  identity->child_filter.clear();
  if (identity->userns_fd < 0) return absl::OkStatus();
  const uint32_t deny = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
  // Another architecture's numbers mean other syscalls: the agent's own filter (still
  // installed below this one) already refuses foreign architectures.
  identity->child_filter = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_setns, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unshare, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, deny),
  };
  return absl::OkStatus();
}

absl::StatusOr<CapsPlan> ParseCapsMask(const char* text) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0') {
    return absl::InvalidArgumentError(fmt::format("--caps: not a number: {}", text));
  }
  CapsPlan plan;
  plan.keep = v;
  plan.last_cap = 40;
  int fd = ::open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[16] = {};
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n > 0) {
      const int last = std::atoi(buf);
      if (last > 0 && last <= 63) plan.last_cap = last;
    }
  }
  return plan;
}

int EnterSandbox(const SandboxIdentity& identity, bool switch_user, uid_t uid, gid_t gid,
                 const gid_t* groups, size_t ngroups, const char** step) {
  for (int fd : identity.cgroup_procs_fds) {
    if (::write(fd, "0", 1) != 1) {
      *step = "join the sandbox's cgroup: write(cgroup.procs, \"0\")";
      return errno;
    }
  }
  if (identity.userns_fd >= 0) {
    if (::setns(identity.userns_fd, CLONE_NEWUSER) != 0) {
      *step = "setns(sandbox user namespace)";
      return errno;
    }
    // A cgroup namespace rooted at the cgroup just joined (it needs CAP_SYS_ADMIN in the new
    // user namespace, which setns just gave): /proc/self/cgroup reads "/", not the agent's
    // sibling directory.
    if (!identity.cgroup_procs_fds.empty() && ::unshare(CLONE_NEWCGROUP) != 0) {
      *step = "unshare(CLONE_NEWCGROUP)";
      return errno;
    }
    int cap_step = 0;
    if (int err = ApplyCaps(identity.caps, &cap_step); err != 0) {
      *step = cap_step == 0 ? "prctl(PR_CAPBSET_DROP)" : cap_step == 1 ? "prctl(PR_CAP_AMBIENT_CLEAR_ALL)" : "capset";
      return err;
    }
  }
  if (switch_user || identity.userns_fd >= 0) {
    // Raw syscalls: glibc's wrappers signal the other threads of the process, and a child of
    // fork has none, but the same code must stay safe if it ever runs after clone(CLONE_VM).
    if (::syscall(SYS_setgroups, ngroups, groups) != 0) {
      *step = "setgroups";
      return errno;
    }
    if (::syscall(SYS_setresgid, gid, gid, gid) != 0) {
      *step = "setresgid";
      return errno;
    }
    if (::syscall(SYS_setresuid, uid, uid, uid) != 0) {
      *step = "setresuid";
      return errno;
    }
  }
  if (!identity.child_filter.empty()) {
    struct sock_fprog prog;
    prog.len = static_cast<unsigned short>(identity.child_filter.size());
    prog.filter = const_cast<sock_filter*>(identity.child_filter.data());
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) {
      *step = "seccomp(child filter)";
      return errno;
    }
  }
  return 0;
}

}  // namespace sbx::agent
