#include "service/job_waiters.h"

#include <gtest/gtest.h>

namespace sbx::service {
namespace {

TEST(JobWaiters, NotifyWakesOnlyThatKeyOnce) {
  JobWaiters w;
  int a = 0, b = 0;
  w.Add("sbx_a", [&] { ++a; });
  w.Add("sbx_a", [&] { ++a; });
  w.Add("sbx_b", [&] { ++b; });
  w.Notify("sbx_a");
  EXPECT_EQ(a, 2);
  EXPECT_EQ(b, 0);
  w.Notify("sbx_a");  // already woken and forgotten
  EXPECT_EQ(a, 2);
  EXPECT_EQ(w.size(), 1u);
}

TEST(JobWaiters, RemovedWaiterIsNotWoken) {
  JobWaiters w;
  int a = 0;
  uint64_t h = w.Add("sbx_a", [&] { ++a; });
  w.Remove(h);
  w.Remove(h);  // twice is harmless
  w.Notify("sbx_a");
  EXPECT_EQ(a, 0);
  EXPECT_EQ(w.size(), 0u);
}

TEST(JobWaiters, WakeMayRegisterAgain) {
  JobWaiters w;
  int n = 0;
  std::function<void()> again = [&] {
    if (++n < 3) w.Add("sbx_a", again);
  };
  w.Add("sbx_a", again);
  w.Notify("sbx_a");
  w.Notify("sbx_a");
  w.Notify("sbx_a");
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace sbx::service
