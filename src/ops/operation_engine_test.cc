#include "ops/operation_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace sbx::ops {
namespace {

TEST(OperationEngine, SameKeyRunsInOrderOneAtATime) {
  std::vector<int> order;
  std::mutex mu;
  std::atomic<int> active{0};
  std::atomic<bool> overlap{false};
  {
    OperationEngine engine(4);
    for (int i = 0; i < 50; ++i) {
      engine.Submit("sbx_a", [&, i] {
        if (active.fetch_add(1) != 0) overlap = true;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        {
          std::lock_guard lock(mu);
          order.push_back(i);
        }
        active.fetch_sub(1);
      });
    }
  }  // destructor drains
  EXPECT_FALSE(overlap);
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(OperationEngine, JobDoneHookSeesTheKeyAfterTheJob) {
  std::mutex mu;
  std::vector<std::string> events;
  {
    OperationEngine engine(2);
    engine.SetJobDoneHook([&](const std::string& key) {
      std::lock_guard lock(mu);
      events.push_back("done " + key);
    });
    engine.Submit("sbx_a", [&] {
      std::lock_guard lock(mu);
      events.push_back("job sbx_a");
    });
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "job sbx_a");
  EXPECT_EQ(events[1], "done sbx_a");
}

TEST(OperationEngine, DifferentKeysRunInParallel) {
  OperationEngine engine(2);
  // Two jobs with different keys that each wait for the other: they can only both finish if
  // they run at the same time (the wait is bounded so a bug fails instead of hanging).
  std::atomic<int> arrived{0};
  std::atomic<int> met{0};
  for (const char* key : {"a", "b"}) {
    engine.Submit(key, [&] {
      ++arrived;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      if (arrived.load() == 2) ++met;
    });
  }
  engine.Shutdown();
  EXPECT_EQ(met.load(), 2);
  EXPECT_EQ(engine.pending(), 0u);
}

TEST(OperationEngine, ThrowingJobDoesNotKillTheWorker) {
  OperationEngine engine(1);
  std::atomic<bool> ran{false};
  engine.Submit("k", [] { throw std::runtime_error("boom"); });
  engine.Submit("k", [&] { ran = true; });
  engine.Shutdown();
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace sbx::ops
