#include "agent/procfs.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <gtest/gtest.h>

namespace sbx::agent {
namespace {

TEST(ParseStat, ReadsTheFieldsAfterTheLastParenthesis) {
  const std::string text =
      "42 (a) (b c) R 7 42 40 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
  auto p = ParseStat(text);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->comm, "a) (b c");
  EXPECT_EQ(p->state, 'R');
  EXPECT_EQ(p->ppid, 7);
  EXPECT_EQ(p->pgrp, 42);
  EXPECT_EQ(p->sid, 40);
  EXPECT_EQ(p->start_ticks, 12345u);
  EXPECT_FALSE(ParseStat("42 (x R 7").has_value());
  EXPECT_FALSE(ParseStat("42 (x) R 7 42").has_value());  // cut short
  EXPECT_FALSE(ParseStat("").has_value());
}

TEST(ReadProc, ReadsThisProcess) {
  std::string text;
  auto p = ReadProc(::getpid(), text);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->pid, ::getpid());
  EXPECT_EQ(p->ppid, ::getppid());
  EXPECT_EQ(p->uid, ::getuid());
}

TEST(DescendsFrom, WalksUpAndEndsOnLoops) {
  const ParentMap parent = {{5, 4}, {4, 3}, {3, 1}, {9, 8}, {8, 9}};
  EXPECT_TRUE(DescendsFrom(parent, 5, 3));
  EXPECT_TRUE(DescendsFrom(parent, 5, 1));
  EXPECT_FALSE(DescendsFrom(parent, 5, 5));  // not its own descendant
  EXPECT_FALSE(DescendsFrom(parent, 3, 4));
  EXPECT_FALSE(DescendsFrom(parent, 9, 1));  // a loop from pid reuse ends
  EXPECT_FALSE(DescendsFrom(parent, 77, 1));  // unknown pid
}

TEST(LiveDescendants, FindsAChildAndNotItself) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  const auto found = LiveDescendants(::getpid());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_NE(std::find(found.begin(), found.end(), child), found.end());
  EXPECT_EQ(std::find(found.begin(), found.end(), ::getpid()), found.end());
}

}  // namespace
}  // namespace sbx::agent
