// The seccomp filter, installed in a forked child (no root needed: no_new_privs suffices).
#include "runtime/ns/seccomp.h"

#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

namespace sbx::runtime::ns {
namespace {

void* ThreadMain(void*) { return nullptr; }

// Runs the checks in a child with the filter installed; returns the number of the first failed
// check, 0 when all passed.
int CheckInChild(const SeccompProgram& prog) {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 100;
  if (InstallSeccomp(prog) != 0) return 101;
  int check = 0;
  auto expect_errno = [&](long rc, int err) { ++check; return rc == -1 && errno == err; };
  if (!expect_errno(::mount("none", "/tmp", "tmpfs", 0, nullptr), EPERM)) return check;         // 1
  if (!expect_errno(::unshare(CLONE_NEWUSER), EPERM)) return check;                              // 2
  if (!expect_errno(::syscall(SYS_clone3, nullptr, 0), ENOSYS)) return check;                    // 3
  if (!expect_errno(::syscall(SYS_clone, CLONE_NEWUTS | SIGCHLD, 0, 0, 0, 0), EPERM)) return check;  // 4
  if (!expect_errno(::syscall(SYS_io_uring_setup, 1, nullptr), EPERM)) return check;             // 5
  if (!expect_errno(::syscall(SYS_bpf, 0, nullptr, 0), EPERM)) return check;                     // 6
  if (!expect_errno(::personality(ADDR_NO_RANDOMIZE), EPERM)) return check;                      // 7
  // personality with high bits set in the 64-bit argument
  if (!expect_errno(::syscall(SYS_personality, 0x100000000UL), EPERM)) return check;            // 8
  ++check;                                                                                        // 9
  if (::personality(0xffffffff) == -1) return check;
  ++check;                                                                                        // 10
  if (::personality(PER_LINUX) == -1) return check;
  ++check;                                                                                        // 11
  if (::getpid() <= 0) return check;
  // fork (clone without namespace flags) and threads (clone3 -> ENOSYS -> clone) still work.
  ++check;                                                                                        // 12
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  if (p < 0) return check;
  int st = 0;
  if (::waitpid(p, &st, 0) != p || !WIFEXITED(st)) return check;
  ++check;                                                                                        // 13
  pthread_t t;
  if (::pthread_create(&t, nullptr, ThreadMain, nullptr) != 0) return check;
  ::pthread_join(t, nullptr);
  return 0;
}

TEST(Seccomp, BuildsOnce) {
  auto prog = BuildSeccompProgram();
  ASSERT_TRUE(prog.ok()) << prog.status();
  EXPECT_GT(prog->main.size(), 20u);
  EXPECT_EQ(prog->personality.size(), 12u);
  EXPECT_FALSE(SeccompDeniedSyscalls().empty());
}

TEST(Seccomp, FilterDeniesAndAllows) {
  auto prog = BuildSeccompProgram();
  ASSERT_TRUE(prog.ok()) << prog.status();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(CheckInChild(*prog));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed check number " << WEXITSTATUS(status);
}

}  // namespace
}  // namespace sbx::runtime::ns
