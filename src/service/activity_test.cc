#include "service/activity.h"

#include <gtest/gtest.h>

namespace sbx::service {
namespace {

using namespace std::chrono_literals;
using Clock = ActivityTracker::Clock;

TEST(ActivityTrackerTest, UntouchedSandboxIsIdleSinceStart) {
  const Clock::time_point t0 = Clock::now();
  ActivityTracker a(t0);
  EXPECT_EQ(a.IdleFor("sbx_a", t0 + 5s), Clock::duration(5s));
}

TEST(ActivityTrackerTest, TouchRestartsTheCountAndNeverGoesBack) {
  const Clock::time_point t0 = Clock::now();
  ActivityTracker a(t0);
  a.Touch("sbx_a", t0 + 10s);
  a.Touch("sbx_a", t0 + 4s);  // a late, older touch must not make it look idle longer
  EXPECT_EQ(a.IdleFor("sbx_a", t0 + 12s), Clock::duration(2s));
  EXPECT_EQ(a.IdleFor("sbx_a", t0 + 9s), Clock::duration::zero());
  EXPECT_EQ(a.IdleFor("sbx_b", t0 + 12s), Clock::duration(12s));
}

TEST(ActivityTrackerTest, OpenStreamKeepsTheSandboxAwake) {
  ActivityTracker a(Clock::now() - 1h);
  Clock::time_point before_close;
  {
    auto g1 = a.StreamOpened("sbx_a");
    {
      auto g2 = a.StreamOpened("sbx_a");
      EXPECT_FALSE(a.IdleFor("sbx_a", Clock::now() + 1h).has_value());
    }
    EXPECT_FALSE(a.IdleFor("sbx_a", Clock::now() + 1h).has_value());  // g1 still open
    before_close = Clock::now();
  }
  // Closing touched it: idle counts from no earlier than the close, not from the hour-old
  // start. Bounded by that order, not by how quickly this line ran after the close.
  const Clock::time_point at = Clock::now() + 1s;
  auto idle = a.IdleFor("sbx_a", at);
  ASSERT_TRUE(idle.has_value());
  EXPECT_LE(*idle, at - before_close);
}

TEST(ActivityTrackerTest, ForgetDropsTheEntryEvenWithAStreamOpen) {
  const Clock::time_point t0 = Clock::now();
  ActivityTracker a(t0);
  {
    auto g = a.StreamOpened("sbx_a");
    a.Forget("sbx_a");
  }  // the guard outliving the entry must not recreate or crash
  EXPECT_EQ(a.IdleFor("sbx_a", t0 + 3s), Clock::duration(3s));
}

}  // namespace
}  // namespace sbx::service
