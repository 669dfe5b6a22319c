#include "agent/oom.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

namespace sbx::agent {
namespace {

TEST(OomCounter, ParsesV1OomControl) {
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 3u);
}

TEST(OomCounter, ParsesV2MemoryEventsAndIgnoresOomGroupKill) {
  EXPECT_EQ(ParseOomKillCount("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 7\n"), 1u);
  EXPECT_EQ(ParseOomKillCount("oom_group_kill 7\noom_kill 4"), 4u);  // no final newline
}

TEST(OomCounter, MissingOrMalformedLineIsZero) {
  EXPECT_EQ(ParseOomKillCount(""), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill_disable 1\nunder_oom 1\n"), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill\n"), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill x\n"), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill -1\n"), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill 5z\n"), 0u);
  EXPECT_EQ(ParseOomKillCount("oom_kill 99999999999999999999999\n"), 0u);
  EXPECT_EQ(ParseOomKillCount(std::string("oom_kill 2\0garbage", 18)), 0u);
}

TEST(OomCounter, ReadsFromOffsetZeroEveryTime) {
  char path[] = "/tmp/sbx-oom-test-XXXXXX";
  int wfd = ::mkstemp(path);
  ASSERT_GE(wfd, 0);
  int rfd = ::open(path, O_RDONLY | O_CLOEXEC);
  ::unlink(path);
  ASSERT_GE(rfd, 0);
  ASSERT_EQ(::write(wfd, "oom_kill 1\n", 11), 11);
  EXPECT_EQ(ReadOomKillCount(rfd), std::optional<uint64_t>(1));
  ASSERT_EQ(::pwrite(wfd, "oom_kill 2\n", 11, 0), 11);
  EXPECT_EQ(ReadOomKillCount(rfd), std::optional<uint64_t>(2));
  EXPECT_EQ(ReadOomKillCount(-1), std::nullopt);
  ::close(wfd);
  ::close(rfd);
  EXPECT_EQ(ReadOomKillCount(rfd), std::nullopt);  // EBADF
}

}  // namespace
}  // namespace sbx::agent
