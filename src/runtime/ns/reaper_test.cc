#include "runtime/ns/reaper.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kPatience{20000};  // how long a test waits for the thread, at most

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

class ReaperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-reaper-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(base_); }

  // A sandbox-like directory with a file and a subdirectory.
  std::string MakeTree(const std::string& name) {
    const std::string dir = fmt::format("{}/{}", base_, name);
    EXPECT_TRUE(MkdirAll(dir + "/upper/sub", 0700).ok());
    EXPECT_TRUE(WriteStringToFile(dir + "/agent.log", "log", /*create=*/true).ok());
    return dir;
  }

  std::string base_;
};

TEST_F(ReaperTest, RemovesDeferredTrees) {
  Reaper reaper(8);
  const std::string a = MakeTree("sbx_a");
  const std::string b = MakeTree("sbx_b");
  ASSERT_TRUE(reaper.Defer(a));
  ASSERT_TRUE(reaper.Defer(b));
  ASSERT_TRUE(reaper.WaitIdle(kPatience));
  EXPECT_FALSE(Exists(a));
  EXPECT_FALSE(Exists(b));
  EXPECT_EQ(reaper.pending(), 0u);
  EXPECT_EQ(reaper.failures(), 0u);
}

TEST_F(ReaperTest, FailedRemovalIsRetriedNeverDropped) {
  std::mutex mu;
  std::map<std::string, int> calls;
  Reaper reaper(
      8,
      [&](const std::string& p) -> absl::Status {
        std::lock_guard lock(mu);
        if (++calls[p] < 3) return absl::InternalError("remove: unlinkat: EBUSY (test)");
        return RemoveTree(p);
      },
      milliseconds(10));
  const std::string a = MakeTree("sbx_retry");
  ASSERT_TRUE(reaper.Defer(a));
  ASSERT_TRUE(reaper.WaitIdle(kPatience));
  EXPECT_FALSE(Exists(a));
  std::lock_guard lock(mu);
  EXPECT_EQ(calls[a], 3);
  EXPECT_EQ(reaper.failures(), 2u);
}

TEST_F(ReaperTest, FullBacklogRefusesSoTheCallerRemovesInline) {
  std::atomic<bool> release{false};
  Reaper reaper(2, [&](const std::string&) -> absl::Status {
    while (!release.load()) ::usleep(1000);
    return absl::OkStatus();
  });
  EXPECT_TRUE(reaper.Defer(base_ + "/1"));
  EXPECT_TRUE(reaper.Defer(base_ + "/2"));
  EXPECT_FALSE(reaper.Defer(base_ + "/3"));  // two pending: in flight or queued
  EXPECT_EQ(reaper.pending(), 2u);
  release = true;
  ASSERT_TRUE(reaper.WaitIdle(kPatience));
  EXPECT_TRUE(reaper.Defer(base_ + "/4"));  // room again
}

TEST_F(ReaperTest, HeldFdIsClosedBeforeTheRemoval) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd read_end(p[0]);
  std::atomic<bool> closed_first{false};
  Reaper reaper(4, [&](const std::string&) -> absl::Status {
    char c;
    closed_first = ::read(read_end.get(), &c, 1) == 0;  // EOF: no writer left
    return absl::OkStatus();
  });
  ASSERT_TRUE(reaper.Defer(base_ + "/held", UniqueFd(p[1])));
  ASSERT_TRUE(reaper.WaitIdle(kPatience));
  EXPECT_TRUE(closed_first.load());
}

TEST_F(ReaperTest, RefusedDeferClosesTheHeldFd) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
  UniqueFd read_end(p[0]);
  Reaper reaper(0);
  EXPECT_FALSE(reaper.Defer(base_ + "/x", UniqueFd(p[1])));
  char c;
  EXPECT_EQ(::read(read_end.get(), &c, 1), 0);
}

TEST_F(ReaperTest, ZeroBacklogDefersNothing) {
  Reaper reaper(0);
  EXPECT_FALSE(reaper.Defer(MakeTree("sbx_inline")));
  EXPECT_EQ(reaper.pending(), 0u);
}

TEST_F(ReaperTest, DestructionFinishesTheQueue) {
  const std::string a = MakeTree("sbx_late");
  {
    // The first attempt fails and is due again only long after the destructor runs: the
    // destructor's last attempt removes it.
    std::atomic<int> n{0};
    Reaper reaper(
        4,
        [&](const std::string& p) -> absl::Status {
          if (n++ == 0) return absl::InternalError("first attempt fails (test)");
          return RemoveTree(p);
        },
        milliseconds(600000));
    ASSERT_TRUE(reaper.Defer(a));
    for (int i = 0; i < 20000 && reaper.failures() == 0; ++i) ::usleep(1000);
    ASSERT_EQ(reaper.failures(), 1u);
    EXPECT_TRUE(Exists(a));
  }
  EXPECT_FALSE(Exists(a));
}

}  // namespace
}  // namespace sbx::runtime::ns
