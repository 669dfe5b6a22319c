// Landlock, applied in forked children. Needs root for the mknod check (CAP_MKNOD: without
// Landlock the node would be created); a host without Landlock fails under
// SBX_TESTS_MUST_RUN=1 and skips otherwise.
#include "runtime/ns/landlock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "common/test_util.h"

namespace sbx::runtime::ns {
namespace {

class LandlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    plan_ = BuildLandlockPlan(&why);
    if (::geteuid() != 0 || plan_.abi == 0) {
      const std::string reason = ::geteuid() != 0 ? "needs root (CAP_MKNOD)" : why;
      SBX_SKIP_OR_FAIL(reason);
    }
    char tmpl[] = "/tmp/sbx-landlock-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (dir_.empty()) return;
    for (const char* name : {"/null", "/null-before", "/a/f", "/b/f", "/fifo"}) ::unlink((dir_ + name).c_str());
    ::rmdir((dir_ + "/a").c_str());
    ::rmdir((dir_ + "/b").c_str());
    ::rmdir(dir_.c_str());
  }

  // Forks, runs `body` in the child after no_new_privs + ApplyLandlock, returns its exit code
  // (0 = pass; the body prints what failed).
  template <typename F>
  int InChild(F body) {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(100);
      if (int err = ApplyLandlock(plan_); err != 0) {
        std::fprintf(stderr, "ApplyLandlock: %s\n", std::strerror(err));
        ::_exit(101);
      }
      ::_exit(body());
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return 200;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  LandlockPlan plan_;
  std::string dir_;
};

TEST_F(LandlockTest, PlanMatchesAbi) {
  EXPECT_EQ(plan_.abi, LandlockAbi());
  EXPECT_GE(plan_.abi, 2);
  EXPECT_EQ(plan_.scoped != 0, plan_.abi >= 6);
  EXPECT_NE(DescribeLandlockPlan(plan_).find("ABI"), std::string::npos);
}

TEST_F(LandlockTest, DeviceNodesDeniedEverythingElseWorks) {
  // Root can create the node before Landlock: the denial below is Landlock's doing.
  ASSERT_EQ(::mknod((dir_ + "/null-before").c_str(), S_IFCHR | 0600, makedev(1, 3)), 0) << std::strerror(errno);
  const std::string d = dir_;
  int rc = InChild([&d]() -> int {
    if (::mknod((d + "/null").c_str(), S_IFCHR | 0600, makedev(1, 3)) != -1 || errno != EACCES) {
      std::fprintf(stderr, "mknod(char) not denied: errno %d\n", errno);
      return 1;
    }
    if (::mknod((d + "/null").c_str(), S_IFBLK | 0600, makedev(7, 0)) != -1 || errno != EACCES) {
      std::fprintf(stderr, "mknod(block) not denied: errno %d\n", errno);
      return 2;
    }
    // Not handled: fifos, files, dirs; and renames into another directory (REFER) still work.
    if (::mkfifo((d + "/fifo").c_str(), 0600) != 0) return 3;
    if (::mkdir((d + "/a").c_str(), 0700) != 0 || ::mkdir((d + "/b").c_str(), 0700) != 0) return 4;
    int fd = ::open((d + "/a/f").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) return 5;
    ::close(fd);
    if (::rename((d + "/a/f").c_str(), (d + "/b/f").c_str()) != 0) {
      std::fprintf(stderr, "cross-directory rename: errno %d\n", errno);
      return 6;
    }
    // Reading and writing an existing device node is not restricted.
    fd = ::open((d + "/null-before").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "x", 1) != 1) return 7;
    ::close(fd);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST_F(LandlockTest, ScopedSignalsAndAbstractSockets) {
  if (plan_.abi < 6) {
    SBX_SKIP_OR_FAIL("Landlock ABI " << plan_.abi << " has no scopes");
  }
  // An abstract socket outside the child's domain (this process's).
  int srv = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(srv, 0);
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  const std::string name = "sbx-landlock-test-" + std::to_string(::getpid());
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(srv, reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(srv, 4), 0);

  int rc = InChild([&]() -> int {
    if (::kill(::getppid(), 0) != -1 || errno != EPERM) {
      std::fprintf(stderr, "kill(parent, 0) not denied: errno %d\n", errno);
      return 1;
    }
    if (::kill(::getpid(), 0) != 0) return 2;  // its own domain: allowed
    // A grandchild inherits the domain: signalling it works.
    pid_t g = ::fork();
    if (g == 0) {
      ::pause();
      ::_exit(0);
    }
    if (g < 0 || ::kill(g, SIGKILL) != 0) return 3;
    ::waitpid(g, nullptr, 0);
    int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0) return 4;
    if (::connect(c, reinterpret_cast<const sockaddr*>(&addr), len) != -1 || errno != EPERM) {
      std::fprintf(stderr, "connect(abstract outside) not denied: errno %d\n", errno);
      return 5;
    }
    ::close(c);
    return 0;
  });
  ::close(srv);
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace sbx::runtime::ns
