#include "ops/operation_engine.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

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

// Every line a job logs, even a plain spdlog call with no idea of operations (as runtime code
// makes), carries the job's context; the worker's next job does not inherit it.
TEST(OperationEngine, JobLinesCarryTheirLogContext) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sbx-engine-log-" + std::to_string(::getpid()) + ".log"))
                               .string();
  std::filesystem::remove(path);
  ASSERT_TRUE(log::Init(log::Options{"json", "info", path}).ok());
  {
    OperationEngine engine(1);
    log::Context ctx;
    ctx.operation = "op_1";
    ctx.sandbox = "sbx_1";
    ctx.tenant = "t";
    engine.Submit("sbx_1", [] { spdlog::info("inside the job"); }, ctx);
    engine.Submit("sbx_1", [] { throw std::runtime_error("boom"); }, ctx);
    engine.Submit("sbx_2", [] { spdlog::info("no context"); });
    engine.Shutdown();
  }
  ASSERT_TRUE(log::Init(log::Options{"json", "info", ""}).ok());
  std::ifstream f(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
  std::filesystem::remove(path);
  // Keys take turns on the one worker: find the lines by message, not position.
  ASSERT_EQ(lines.size(), 3u);
  int with_context = 0;
  for (const auto& l : lines) {
    const std::string msg = l["msg"];
    if (msg == "no context") {
      EXPECT_FALSE(l.contains("operation")) << l.dump();
      continue;
    }
    EXPECT_TRUE(msg == "inside the job" || msg.find("threw: boom") != std::string::npos) << msg;
    EXPECT_EQ(l["operation"], "op_1") << l.dump();
    EXPECT_EQ(l["sandbox"], "sbx_1") << l.dump();
    EXPECT_EQ(l["tenant"], "t") << l.dump();
    ++with_context;
  }
  EXPECT_EQ(with_context, 2);
}

}  // namespace
}  // namespace sbx::ops
