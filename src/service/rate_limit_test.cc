#include "service/rate_limit.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace sbx::service {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// An injected clock: a fixed origin plus whatever the test says has passed.
const Clock::time_point kT0 = Clock::time_point(std::chrono::hours(1000));

std::map<std::string, std::string> Headers(const RateLimiter::Decision& d) {
  std::map<std::string, std::string> out;
  for (auto& [k, v] : RateLimitHeaders(d)) {
    EXPECT_TRUE(out.emplace(k, v).second) << "duplicate header " << k;
  }
  return out;
}

TEST(RateLimiter, BurstThenDenial) {
  RateLimiter rl;
  for (uint64_t i = 0; i < 5; ++i) {
    auto d = rl.Take("tok_a", 1.0, 5, kT0);
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.limit, 5u);
    EXPECT_EQ(d.remaining, 4 - i);
    EXPECT_DOUBLE_EQ(d.reset_s, static_cast<double>(i + 1));
    EXPECT_EQ(d.retry_after_s, 0);
  }
  auto d = rl.Take("tok_a", 1.0, 5, kT0);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 5u);
  EXPECT_EQ(d.remaining, 0u);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 1.0);
  EXPECT_DOUBLE_EQ(d.reset_s, 5.0);
  // Another key has its own bucket.
  EXPECT_TRUE(rl.Take("tok_b", 1.0, 5, kT0).allowed);
  EXPECT_EQ(rl.size(), 2u);
}

TEST(RateLimiter, RefillsOverTime) {
  RateLimiter rl;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(rl.Take("k", 2.0, 3, kT0).allowed);
  auto d = rl.Take("k", 2.0, 3, kT0);
  ASSERT_FALSE(d.allowed);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 0.5);

  // 0.25 s: half a token, still denied, and retry-after shrinks with it.
  d = rl.Take("k", 2.0, 3, kT0 + milliseconds(250));
  EXPECT_FALSE(d.allowed);
  EXPECT_NEAR(d.retry_after_s, 0.25, 1e-9);
  EXPECT_NEAR(d.reset_s, 1.25, 1e-9);

  // 0.5 s: one token.
  d = rl.Take("k", 2.0, 3, kT0 + milliseconds(500));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0u);
  EXPECT_FALSE(rl.Take("k", 2.0, 3, kT0 + milliseconds(500)).allowed);

  // Ten steps of 0.05 s at 2/s add up to one token despite float rounding.
  for (int i = 1; i <= 10; ++i) {
    d = rl.Take("k", 2.0, 3, kT0 + milliseconds(500 + 50 * i));
    EXPECT_EQ(d.allowed, i == 10) << i;
  }

  // Long idle: full again, never more than the burst.
  d = rl.Take("k", 2.0, 3, kT0 + std::chrono::hours(1));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2u);
  EXPECT_NEAR(d.reset_s, 0.5, 1e-9);
}

TEST(RateLimiter, ClockGoingBackwardsAddsNothing) {
  RateLimiter rl;
  ASSERT_TRUE(rl.Take("k", 1.0, 1, kT0 + std::chrono::seconds(10)).allowed);
  EXPECT_FALSE(rl.Take("k", 1.0, 1, kT0).allowed);
  // The earlier `now` did not move the bucket's time back: no token out of nothing.
  EXPECT_FALSE(rl.Take("k", 1.0, 1, kT0 + std::chrono::milliseconds(10500)).allowed);
  EXPECT_TRUE(rl.Take("k", 1.0, 1, kT0 + std::chrono::seconds(11)).allowed);
}

TEST(RateLimiter, RateAndBurstMayChange) {
  RateLimiter rl;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(rl.Take("k", 1.0, 100, kT0).allowed);
  // A lower burst cuts what is left (90) to it.
  auto d = rl.Take("k", 1.0, 3, kT0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 3u);
  EXPECT_EQ(d.remaining, 2u);
}

TEST(RateLimiter, ZeroBurstCountsAsOne) {
  RateLimiter rl;
  auto d = rl.Take("k", 1.0, 0, kT0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 1u);
  EXPECT_FALSE(rl.Take("k", 1.0, 0, kT0).allowed);
}

TEST(RateLimiter, Unlimited) {
  RateLimiter rl;
  for (double rate : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    for (int i = 0; i < 1000; ++i) {
      auto d = rl.Take("k", rate, 1, kT0);
      ASSERT_TRUE(d.allowed);
      EXPECT_EQ(d.limit, 0u);
      EXPECT_EQ(d.retry_after_s, 0);
    }
    EXPECT_TRUE(RateLimitHeaders(rl.Take("k", rate, 1, kT0)).empty());
  }
  EXPECT_EQ(rl.size(), 0u);  // nothing kept for unlimited keys
}

TEST(RateLimiter, RetryAfterSecondsRoundsUp) {
  EXPECT_EQ(RetryAfterSeconds(0), 0u);
  EXPECT_EQ(RetryAfterSeconds(-3), 0u);
  EXPECT_EQ(RetryAfterSeconds(std::numeric_limits<double>::quiet_NaN()), 0u);
  EXPECT_EQ(RetryAfterSeconds(1e-12), 1u);
  EXPECT_EQ(RetryAfterSeconds(0.001), 1u);
  EXPECT_EQ(RetryAfterSeconds(1.0), 1u);
  EXPECT_EQ(RetryAfterSeconds(1.0 + 1e-12), 1u);  // float noise, not a second more
  EXPECT_EQ(RetryAfterSeconds(1.01), 2u);
  EXPECT_EQ(RetryAfterSeconds(59.5), 60u);
  EXPECT_EQ(RetryAfterSeconds(1e300), 86400u);
  EXPECT_EQ(RetryAfterSeconds(std::numeric_limits<double>::infinity()), 86400u);
}

TEST(RateLimiter, Headers) {
  RateLimiter rl;
  auto h = Headers(rl.Take("k", 0.5, 2, kT0));
  EXPECT_EQ(h.size(), 3u);
  EXPECT_EQ(h["RateLimit-Limit"], "2");
  EXPECT_EQ(h["RateLimit-Remaining"], "1");
  EXPECT_EQ(h["RateLimit-Reset"], "2");
  EXPECT_EQ(h.count("Retry-After"), 0u);

  ASSERT_TRUE(rl.Take("k", 0.5, 2, kT0).allowed);
  h = Headers(rl.Take("k", 0.5, 2, kT0 + milliseconds(100)));
  EXPECT_EQ(h.size(), 4u);
  EXPECT_EQ(h["RateLimit-Remaining"], "0");
  EXPECT_EQ(h["RateLimit-Reset"], "4");  // 3.9 s rounded up
  EXPECT_EQ(h["Retry-After"], "2");      // 1.9 s rounded up

  // Slow rates cannot overflow the integers.
  RateLimiter slow;
  ASSERT_TRUE(slow.Take("k", 1e-300, 1, kT0).allowed);
  h = Headers(slow.Take("k", 1e-300, 1, kT0));
  EXPECT_EQ(h["Retry-After"], "86400");
  EXPECT_EQ(h["RateLimit-Reset"], "86400");
}

TEST(RateLimiter, MemoryStaysBounded) {
  constexpr size_t kMax = 1000;
  RateLimiter rl(kMax);
  // All at kT0: no bucket is full again, so every eviction falls back to the least recently
  // used.
  for (size_t i = 0; i < 2 * kMax; ++i) {
    const std::string key = "tok_" + std::to_string(i);
    ASSERT_TRUE(rl.Take(key, 1.0, 1, kT0).allowed);
    if (i % 2 == 0) rl.Take(key, 1.0, 1, kT0);
    ASSERT_LE(rl.size(), kMax);
  }
  EXPECT_EQ(rl.size(), kMax);
  // The most recent keys are still there: drained ones stay drained.
  EXPECT_FALSE(rl.Take("tok_" + std::to_string(2 * kMax - 2), 1.0, 1, kT0).allowed);
  // The oldest are forgotten: a fresh, full bucket.
  EXPECT_TRUE(rl.Take("tok_0", 1.0, 1, kT0).allowed);
  EXPECT_EQ(rl.size(), kMax);
  EXPECT_EQ(RateLimiter(0).max_keys(), 1u);
}

TEST(RateLimiter, EvictsFullBucketsBeforeDrainedOnes) {
  RateLimiter rl(4);
  // "hot" is the least recently used and drained; a, b, c were used once each.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(rl.Take("hot", 1.0, 5, kT0).allowed);
  for (const char* k : {"a", "b", "c"}) ASSERT_TRUE(rl.Take(k, 1.0, 5, kT0).allowed);
  // 2 s later a, b, c are full again; hot has 2 of its 5.
  const auto t = kT0 + std::chrono::seconds(2);
  ASSERT_TRUE(rl.Take("d", 1.0, 5, t).allowed);  // evicts a full bucket, not hot
  EXPECT_EQ(rl.size(), 4u);
  auto hot = rl.Take("hot", 1.0, 5, t);
  EXPECT_TRUE(hot.allowed);
  EXPECT_EQ(hot.remaining, 1u);  // 4 had it been forgotten and started full
}

TEST(RateLimiter, ConcurrentTakesNeverExceedBurstPlusRefill) {
  constexpr double kRate = 200;
  constexpr uint64_t kBurst = 50;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  RateLimiter rl(8);
  std::atomic<uint64_t> allowed{0};
  std::atomic<bool> go{false};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      uint64_t mine = 0;
      for (int i = 0; i < kPerThread; ++i) {
        // One shared key, plus keys of each thread's own (28 in all for 8 places) to make
        // evictions under the lock. Each thread touches "shared" before each of its own keys,
        // so "shared" is never more than 4 places from the front and is never evicted.
        if (rl.Take("shared", kRate, kBurst, Clock::now()).allowed) ++mine;
        rl.Take("own" + std::to_string(t * 1000 + i % 7), kRate, kBurst, Clock::now());
      }
      allowed += mine;
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const double bound = static_cast<double>(kBurst) + kRate * elapsed;
  EXPECT_LE(static_cast<double>(allowed.load()), std::floor(bound) + 1)
      << "elapsed " << elapsed << " s";
  EXPECT_GE(allowed.load(), kBurst);
  EXPECT_LE(rl.size(), 8u);
}

}  // namespace
}  // namespace sbx::service
