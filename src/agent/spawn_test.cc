#include "agent/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "agent/identity.h"

namespace sbx::agent {
namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      ::usleep(1000);
      continue;
    }
    return out;
  }
}

std::string OwnOomScoreAdj() {
  int fd = ::open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string s = ReadAll(fd);
  ::close(fd);
  return s;
}

TEST(Spawn, RunsTheProgramInItsOwnGroupWithPipes) {
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out; echo err >&2; set -- $(cat /proc/$$/stat); [ \"$5\" -eq $$ ] && exit 7"};
  spec.env = {"PATH=/usr/bin:/bin"};
  auto p = Spawn(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ReadAll(p->stdout_fd.get()), "out\n");
  EXPECT_EQ(ReadAll(p->stderr_fd.get()), "err\n");
  int status = 0;
  ASSERT_EQ(::waitpid(p->pid, &status, 0), p->pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

// The child shares the caller's memory (CLONE_VM), and the dumpable flag belongs to the memory:
// the child's oom_score_adj write must not leave the caller dumpable, even when the child fails
// before the credential change that would clear it, and the child's score must stay its own.
TEST(Spawn, TheCallerStaysNonDumpableAndKeepsItsOomScore) {
  const int was_dumpable = ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
  ASSERT_EQ(::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
  const std::string score_before = OwnOomScoreAdj();

  // A read-only fd as the "cgroup.procs" file: the child fails at the first identity step,
  // right after its dumpable oom_score_adj write; the user namespace fd is never reached.
  int ro = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  SandboxIdentity identity;
  identity.userns_fd = ro;
  identity.cgroup_procs_fds = {ro};
  SpawnSpec spec;
  spec.argv = {"/bin/true"};
  spec.identity = &identity;
  auto p = Spawn(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 0);
  EXPECT_EQ(OwnOomScoreAdj(), score_before);
  EXPECT_NE(ReadAll(p->stderr_fd.get()).find("join the sandbox's cgroup"), std::string::npos);
  int status = 0;
  ASSERT_EQ(::waitpid(p->pid, &status, 0), p->pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 126);
  ::close(ro);
  ::prctl(PR_SET_DUMPABLE, was_dumpable, 0, 0, 0);
}

// The child resets only the dispositions recorded as not SIG_DFL: an ignored signal and a
// blocked one in the caller must both reach the program as default and unblocked.
TEST(Spawn, TheProgramStartsWithDefaultSignalsAndAnEmptyMask) {
  struct sigaction old_usr1 {}, old_hup {}, ign {};
  ign.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGUSR1, &ign, &old_usr1), 0);
  ASSERT_EQ(::sigaction(SIGHUP, &ign, &old_hup), 0);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  ASSERT_EQ(::sigprocmask(SIG_BLOCK, &block, &old_mask), 0);
  RecordSignalDispositions();

  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", "grep -E '^Sig(Ign|Blk):' /proc/self/status"};
  spec.env = {"PATH=/usr/bin:/bin"};
  auto p = Spawn(spec);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  ::sigaction(SIGHUP, &old_hup, nullptr);
  RecordSignalDispositions();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ReadAll(p->stdout_fd.get()), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
  int status = 0;
  ASSERT_EQ(::waitpid(p->pid, &status, 0), p->pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Without a stdin pipe every child reads /dev/null, read-only, the agent's one (opened once,
// not per spawn): a program that reads stdin sees EOF, spawn after spawn.
TEST(Spawn, StdinIsDevNullForEveryChild) {
  for (int i = 0; i < 2; ++i) {
    SpawnSpec spec;
    spec.argv = {"/bin/sh", "-c",
                 "cat; readlink /proc/self/fd/0; grep ^flags /proc/self/fdinfo/0"};
    spec.env = {"PATH=/usr/bin:/bin"};
    auto p = Spawn(spec);
    ASSERT_TRUE(p.ok()) << p.status();
    const std::string out = ReadAll(p->stdout_fd.get());
    EXPECT_EQ(out.rfind("/dev/null\n", 0), 0u) << out;
    // Octal flags ending in 0: O_RDONLY (dup2 onto 0 cleared O_CLOEXEC).
    EXPECT_NE(out.find("flags:"), std::string::npos) << out;
    EXPECT_EQ(out.back(), '\n');
    EXPECT_EQ(out[out.size() - 2], '0') << out;
    int status = 0;
    ASSERT_EQ(::waitpid(p->pid, &status, 0), p->pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

}  // namespace
}  // namespace sbx::agent
