#include "common/process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace sbx {
namespace {

TEST(Process, FindsProgramsInSbinAndPathAndNamesWhatIsMissing) {
  auto sh = FindProgram("sh");
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_EQ(sh->front(), '/');
  EXPECT_TRUE(FindProgram("/bin/sh").ok());
  auto missing = FindProgram("sbx-no-such-program");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("sbx-no-such-program"), std::string::npos);
  EXPECT_FALSE(FindProgram("/nonexistent/sh").ok());
}

TEST(Process, RunProgramReturnsTheExitStatusAndOutput) {
  std::string out;
  auto rc = RunProgram({"/bin/sh", "-c", "echo to-out; echo to-err >&2; exit 3"}, &out);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 3);
  EXPECT_NE(out.find("to-out"), std::string::npos);
  EXPECT_NE(out.find("to-err"), std::string::npos);
  out.clear();
  rc = RunProgram({"/bin/sh", "-c", "kill -9 $$"}, &out);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 128 + 9);
  EXPECT_FALSE(RunProgram({"/nonexistent"}, &out).ok());
}

TEST(Process, RunProgramPassesOnNoDescriptorButItsOutput) {
  // One without O_CLOEXEC, as asio makes its sockets: the program must not get it.
  const int fd = ::fcntl(STDERR_FILENO, F_DUPFD, 200);
  ASSERT_GE(fd, 200);
  std::string out;
  auto rc = RunProgram({"/bin/sh", "-c", "test -e /proc/self/fd/" + std::to_string(fd) +
                                             " && echo inherited; ls /proc/self/fd"},
                       &out);
  ::close(fd);
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << out;
  EXPECT_EQ(out.find("inherited"), std::string::npos) << out;
  // 0-2, and the descriptor `ls` reads /proc/self/fd with.
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) EXPECT_LE(std::atoi(line.c_str()), 3) << out;
}

TEST(Process, CloseInheritedDescriptorsClosesWhatLacksCloseOnExecOnly) {
  // In a child: the function closes descriptors of the whole process, the test runner's too.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int inherited[2], own[2];
    if (::pipe(inherited) != 0 || ::pipe2(own, O_CLOEXEC) != 0) ::_exit(10);
    const int high = ::fcntl(inherited[0], F_DUPFD, 300);  // far above the others
    auto closed = CloseInheritedDescriptors();
    if (!closed.ok() || *closed < 3) ::_exit(11);
    for (int fd : {inherited[0], inherited[1], high}) {
      if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) ::_exit(12);
    }
    for (int fd : {own[0], own[1], 0, 1, 2}) {
      if (::fcntl(fd, F_GETFD) == -1) ::_exit(13);
    }
    auto again = CloseInheritedDescriptors();  // nothing is left to close
    ::_exit(again.ok() && *again == 0 ? 0 : 14);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 pipes, 11 count, 12 left open, 13 closed too much, 14 second call";
}

TEST(Process, SpawnDetachedGivesASessionALogAndFd3) {
  char dir[] = "/tmp/sbx-process-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/log";
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::write(p[1], "from-fd3", 8);
  ::close(p[1]);
  // The child reads fd 3, says its session id is its pid, and that fd 4 is closed.
  auto pid = SpawnDetached({"/bin/sh", "-c",
                            "cat <&3; echo; ps -o sid= -p $$ | tr -d ' '; echo $$; "
                            "(: <&4) 2>/dev/null && echo fd4-open || echo fd4-closed"},
                           DetachedOptions{.log = log, .pass_fd = p[0]});
  ::close(p[0]);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string line, sid, self;
  std::getline(ss, line);
  EXPECT_EQ(line, "from-fd3");
  std::getline(ss, sid);
  std::getline(ss, self);
  EXPECT_EQ(sid, self);
  std::getline(ss, line);
  EXPECT_EQ(line, "fd4-closed");
  ::unlink(log.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace sbx
