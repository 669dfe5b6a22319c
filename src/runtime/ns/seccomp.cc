#include "runtime/ns/seccomp.h"

#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

namespace {

#if defined(__x86_64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
#error "seccomp filter: unsupported architecture"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr uint32_t kArg0Lo = offsetof(struct seccomp_data, args[0]);
constexpr uint32_t kArg0Hi = offsetof(struct seccomp_data, args[0]) + 4;
#else
constexpr uint32_t kArg0Lo = offsetof(struct seccomp_data, args[0]) + 4;
constexpr uint32_t kArg0Hi = offsetof(struct seccomp_data, args[0]);
#endif

// clone() flags that create namespaces. CLONE_NEWTIME (0x80) is absent: in clone() it overlaps
// the exit-signal bits and the kernel rejects it there; unshare/clone3 are denied anyway.
constexpr uint64_t kCloneNewFlags[] = {CLONE_NEWNS,  CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
                                       CLONE_NEWUSER, CLONE_NEWPID,   CLONE_NEWNET};

std::vector<sock_filter> PersonalityFilter() {
  const uint32_t deny = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
  return {
      /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      // Other architectures are killed by the main filter; not this filter's business.
      /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 0, 8),
      /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, 6),
      // The kernel reads an unsigned int; any high bits mean a caller playing games: deny.
      /* 4 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArg0Hi),
      /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 5),
      /* 6 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArg0Lo),
      /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0, 2, 0),
      /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x8, 1, 0),
      /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, 0, 1),
      /* 10 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      /* 11 */ BPF_STMT(BPF_RET | BPF_K, deny),
  };
}

struct CtxDeleter {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};

}  // namespace

const std::vector<std::string>& SeccompDeniedSyscalls() {
  static const std::vector<std::string> kDenied = {
      // mounts and the new mount API: the sandbox's mount table is final at exec
      "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
      "open_tree", "mount_setattr",
      // namespaces: no nesting, no joining (clone flags are checked separately)
      "unshare", "setns",
      // host administration
      "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module",
      "finit_module", "delete_module", "acct", "quotactl", "quotactl_fd", "settimeofday",
      "clock_settime", "clock_adjtime", "adjtimex", "syslog", "lookup_dcookie",
      // large kernel attack surface that sandboxed code does not need
      "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd",
      "io_uring_setup", "io_uring_enter", "io_uring_register",
      // file handles bypass path-based checks (the "shocker" escape)
      "open_by_handle_at", "name_to_handle_at",
      // cross-process memory access
      "ptrace", "process_vm_readv", "process_vm_writev",
  };
  return kDenied;
}

absl::StatusOr<SeccompProgram> BuildSeccompProgram() {
  std::unique_ptr<void, CtxDeleter> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (!ctx) return absl::InternalError("seccomp: seccomp_init failed");
  for (const std::string& name : SeccompDeniedSyscalls()) {
    int nr = seccomp_syscall_resolve_name(name.c_str());
    if (nr == __NR_SCMP_ERROR) {
      // Older libseccomp that does not know a newer syscall; the kernel may still have it.
      spdlog::warn("seccomp: libseccomp does not know syscall {}; it stays allowed", name);
      continue;
    }
    int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), nr, 0);
    if (rc < 0) return ErrnoStatus(-rc, fmt::format("seccomp: seccomp_rule_add({})", name));
  }
  for (uint64_t flag : kCloneNewFlags) {
    int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
    if (rc < 0) return ErrnoStatus(-rc, fmt::format("seccomp: seccomp_rule_add(clone & {:#x})", flag));
  }
  int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc < 0) return ErrnoStatus(-rc, "seccomp: seccomp_rule_add(clone3)");

  // libseccomp 2.5 can only export to an fd.
  UniqueFd mfd(static_cast<int>(::syscall(SYS_memfd_create, "sbx-seccomp", MFD_CLOEXEC)));
  if (!mfd) return ErrnoStatus(errno, "seccomp: memfd_create(sbx-seccomp)");
  rc = seccomp_export_bpf(ctx.get(), mfd.get());
  if (rc < 0) return ErrnoStatus(-rc, "seccomp: seccomp_export_bpf");
  off_t size = ::lseek(mfd.get(), 0, SEEK_END);
  if (size <= 0 || size % static_cast<off_t>(sizeof(sock_filter)) != 0) {
    return absl::InternalError(fmt::format("seccomp: exported BPF has odd size {}", size));
  }
  SeccompProgram prog;
  prog.main.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  ssize_t n = ::pread(mfd.get(), prog.main.data(), static_cast<size_t>(size), 0);
  if (n != size) return ErrnoStatus(n < 0 ? errno : EIO, "seccomp: read exported BPF");
  prog.personality = PersonalityFilter();
  return prog;
}

int InstallSeccomp(const SeccompProgram& prog) {
  const std::vector<sock_filter>* filters[] = {&prog.personality, &prog.main};
  for (const auto* f : filters) {
    struct sock_fprog fprog;
    fprog.len = static_cast<unsigned short>(f->size());
    fprog.filter = const_cast<sock_filter*>(f->data());
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) return errno;
  }
  return 0;
}

}  // namespace sbx::runtime::ns
