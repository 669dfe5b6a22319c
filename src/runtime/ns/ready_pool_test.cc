#include "runtime/ns/ready_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

namespace sbx::runtime::ns {
namespace {

using namespace std::chrono_literals;

// An item that counts its live copies, so a test sees what the pool destroyed.
struct Item {
  explicit Item(int v, std::shared_ptr<std::atomic<int>> live) : value(v), live(std::move(live)) { ++*this->live; }
  Item(Item&& o) noexcept : value(o.value), published(o.published), live(std::move(o.live)) {}
  Item& operator=(Item&&) = delete;
  ~Item() {
    if (live) --*live;
  }
  int value;
  bool published = false;
  std::shared_ptr<std::atomic<int>> live;
};

template <typename F>
bool WaitFor(F pred) {
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

TEST(ReadyPoolTest, FillsToSizeAndPublishesBeforePooling) {
  auto live = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> made{0};
  ReadyPool<Item> pool(
      2, [&]() -> absl::StatusOr<Item> { return Item(made++, live); },
      [](const absl::Status&) { return true; },
      [](Item& i) {
        i.published = true;
        return absl::OkStatus();
      });
  pool.Start();
  ASSERT_TRUE(WaitFor([&] { return pool.ready() == 2; }));
  std::optional<Item> a = pool.Take();
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->published);
  EXPECT_EQ(a->value, 0);
  ASSERT_TRUE(WaitFor([&] { return pool.ready() == 2; }));  // refilled
  pool.Stop();
  EXPECT_EQ(made.load(), 3);
}

TEST(ReadyPoolTest, AnItemBuiltAcrossADrainIsDestroyedNotPooled) {
  auto live = std::make_shared<std::atomic<int>>(0);
  std::mutex mu;
  std::condition_variable cv;
  bool building = false, release = false;
  std::atomic<int> made{0};
  ReadyPool<Item> pool(
      1,
      [&]() -> absl::StatusOr<Item> {
        int n = made++;
        if (n == 0) {  // the first build waits until the test has drained the pool
          std::unique_lock lock(mu);
          building = true;
          cv.notify_all();
          cv.wait(lock, [&] { return release; });
        }
        return Item(n, live);
      },
      [](const absl::Status&) { return true; });
  pool.Start();
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return building; });
  }
  EXPECT_TRUE(pool.Drain().empty());
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  // The old build is dropped; the pool then holds the next one, made after the drain.
  ASSERT_TRUE(WaitFor([&] { return pool.ready() == 1; }));
  std::optional<Item> got = pool.Take();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->value, 1);
  pool.Stop();
  got.reset();
  EXPECT_TRUE(WaitFor([&] { return pool.ready() == 0; }));
}

TEST(ReadyPoolTest, AFailedPublishIsAnErrorAndTheItemIsDestroyed) {
  auto live = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> errors{0};
  std::atomic<int> made{0};
  ReadyPool<Item> pool(
      1, [&]() -> absl::StatusOr<Item> { return Item(made++, live); },
      [&](const absl::Status& st) {
        EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
        ++errors;
        return false;  // stop the filler
      },
      [](Item&) { return absl::AlreadyExistsError("rename: exists"); });
  pool.Start();
  ASSERT_TRUE(WaitFor([&] { return errors.load() == 1; }));
  pool.Stop();
  EXPECT_EQ(pool.ready(), 0);
  EXPECT_EQ(live->load(), 0);
}

// A refill waits until no Take came for the delay: the first fill does not, and a take
// starts the quiet period again.
TEST(ReadyPoolTest, ARefillWaitsForTheQuietPeriodAfterATake) {
  auto live = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> made{0};
  ReadyPool<Item> pool(
      1, [&]() -> absl::StatusOr<Item> { return Item(made++, live); },
      [](const absl::Status&) { return true; });
  pool.set_refill_delay(3s);
  const auto start = std::chrono::steady_clock::now();
  pool.Start();
  ASSERT_TRUE(WaitFor([&] { return pool.ready() == 1; }));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);  // the first fill does not wait
  const auto taken_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(pool.Take().has_value());
  std::this_thread::sleep_for(100ms);
  // Measured against the take, so a slow test thread cannot make this fail wrongly.
  if (std::chrono::steady_clock::now() - taken_at < 3s) {
    EXPECT_EQ(made.load(), 1);
    EXPECT_EQ(pool.ready(), 0);
  }
  // A take that finds the pool empty starts the quiet period again as well.
  const auto empty_take_at = std::chrono::steady_clock::now();
  ASSERT_LT(empty_take_at - taken_at, 3s) << "the test thread stalled past the quiet period";
  EXPECT_FALSE(pool.Take().has_value());
  ASSERT_TRUE(WaitFor([&] { return pool.ready() == 1; }));
  EXPECT_GE(std::chrono::steady_clock::now() - empty_take_at, 3s);
  EXPECT_EQ(made.load(), 2);
}

}  // namespace
}  // namespace sbx::runtime::ns
