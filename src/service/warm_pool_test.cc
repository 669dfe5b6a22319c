#include "service/warm_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

namespace sbx::service {
namespace {

using namespace std::chrono_literals;

const runtime::Resources kRes{};

class CountingInstance : public runtime::Instance {
 public:
  CountingInstance(std::string id, std::atomic<int>* destroyed) : id_(std::move(id)), destroyed_(destroyed) {}
  const std::string& id() const override { return id_; }
  std::string AgentSocketPath() const override { return "/nonexistent"; }
  runtime::Json Persist() const override { return runtime::Json::object(); }
  bool Alive() const override { return alive; }
  absl::Status Destroy() override {
    if (!done_) ++*destroyed_;
    done_ = true;
    return absl::OkStatus();
  }
  bool alive = true;

 private:
  std::string id_;
  std::atomic<int>* destroyed_;
  bool done_ = false;
};

struct Fixture {
  std::atomic<int> built{0};
  std::atomic<int> destroyed{0};
  std::atomic<bool> fail{false};
  std::string digest = "sha256:a";
  std::atomic<int64_t> pids{kRes.pids};  // of what the builder makes from now on
  WarmPool::Builder Builder() {
    return [this](const WarmPoolConfig& c) -> absl::StatusOr<WarmSandbox> {
      if (fail) return absl::UnavailableError("runtime broken");
      int n = built++;
      runtime::Resources r = kRes;
      r.pids = pids;
      return WarmSandbox{std::make_unique<CountingInstance>("sbx_" + std::to_string(n), &destroyed),
                         c.runtime, c.template_name, digest, r};
    };
  }
};

// Waits (bounded) until `pred` holds.
template <class Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Waits (bounded) until the pool reports `n` ready sandboxes.
bool WaitReady(const WarmPool& pool, int n) {
  for (int i = 0; i < 500; ++i) {
    auto ready = pool.Ready();
    if (ready.count("ns/base") ? ready.at("ns/base") == n : n == 0) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(WarmPool, FillsHandsOutEachOnceAndRefills) {
  Fixture f;
  WarmPool pool({{"ns", "base", 3}}, f.Builder());
  pool.Start();
  ASSERT_TRUE(WaitReady(pool, 3));
  std::set<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto sb = pool.Take("ns", "base", "sha256:a", kRes);
    ASSERT_TRUE(sb.has_value());
    EXPECT_TRUE(ids.insert(sb->instance->id()).second) << "handed out twice: " << sb->instance->id();
  }
  ASSERT_TRUE(WaitReady(pool, 3));  // refilled in the background
  EXPECT_EQ(f.built.load(), 6);
  EXPECT_FALSE(pool.Take("ns", "other", "sha256:a", kRes).has_value());
  EXPECT_FALSE(pool.Take("fake", "base", "sha256:a", kRes).has_value());
}

TEST(WarmPool, StopDestroysWhatIsPooledButNotWhatWasHandedOut) {
  Fixture f;
  std::optional<WarmSandbox> taken;
  {
    WarmPool pool({{"ns", "base", 2}}, f.Builder());
    pool.Start();
    ASSERT_TRUE(WaitReady(pool, 2));
    taken = pool.Take("ns", "base", "sha256:a", kRes);
    ASSERT_TRUE(taken.has_value());
  }
  // Whatever the pool held at Stop (2, if the refill finished) is destroyed; the taken one is not.
  EXPECT_EQ(f.destroyed.load(), f.built.load() - 1);
}

TEST(WarmPool, StaleDigestAndDeadAgentsAreDroppedNotHandedOut) {
  Fixture f;
  WarmPool pool({{"ns", "base", 1}}, f.Builder());
  pool.Start();
  ASSERT_TRUE(WaitReady(pool, 1));
  // Everything pooled was built from sha256:a: nothing matches, and what was looked at is gone.
  EXPECT_FALSE(pool.Take("ns", "base", "sha256:changed", kRes).has_value());
  EXPECT_GE(f.destroyed.load(), 1);

  ASSERT_TRUE(WaitReady(pool, 1));
  auto sb = pool.Take("ns", "base", "sha256:a", kRes);
  ASSERT_TRUE(sb.has_value());
  const std::string dead_id = sb->instance->id();
  static_cast<CountingInstance*>(sb->instance.get())->alive = false;
  const int destroyed_before = f.destroyed.load();
  pool.Return(std::move(*sb));
  // The refill may have built a fresh one meanwhile; the dead one is never handed out.
  auto next = pool.Take("ns", "base", "sha256:a", kRes);
  if (next.has_value()) {
    EXPECT_NE(next->instance->id(), dead_id);
  }
  EXPECT_EQ(f.destroyed.load(), destroyed_before + 1);
}

TEST(WarmPool, ATagMoveDrainsTheOldReleaseAndTheRefillFollows) {
  Fixture f;
  WarmPool pool({{"ns", "base", 1}}, f.Builder());
  pool.Start();
  ASSERT_TRUE(WaitReady(pool, 1));
  EXPECT_EQ(pool.Digests(), (std::map<std::string, int>{{"sha256:a", 1}}));
  // Still the release the template names: kept.
  pool.DrainStale([](const std::string& name) -> std::optional<std::string> {
    EXPECT_EQ(name, "base");
    return "sha256:a";
  });
  EXPECT_EQ(f.destroyed.load(), 0);
  // The tag moved: the pooled sandbox goes at once, not at the next take.
  pool.DrainStale([](const std::string&) -> std::optional<std::string> { return "sha256:b"; });
  EXPECT_EQ(f.destroyed.load(), 1);
  ASSERT_TRUE(Eventually([&] { return f.built.load() == 2; }));
  // The template went: likewise.
  ASSERT_TRUE(WaitReady(pool, 1));
  pool.DrainStale([](const std::string&) -> std::optional<std::string> { return std::nullopt; });
  EXPECT_EQ(f.destroyed.load(), 2);
}

TEST(WarmPool, FailingBuilderBacksOffInsteadOfSpinning) {
  Fixture f;
  f.fail = true;
  std::atomic<int> calls{0};
  WarmPool pool({{"ns", "base", 2}}, [&](const WarmPoolConfig& c) -> absl::StatusOr<WarmSandbox> {
    ++calls;
    return absl::UnavailableError("runtime broken");
  });
  pool.Start();
  std::this_thread::sleep_for(300ms);
  EXPECT_LE(calls.load(), 2) << "builder retried without backing off";
  EXPECT_EQ(pool.Ready().at("ns/base"), 0);
}

TEST(WarmPool, SizeZeroIsNoPool) {
  Fixture f;
  WarmPool pool({{"ns", "base", 0}}, f.Builder());
  pool.Start();
  EXPECT_TRUE(pool.Ready().empty());
  EXPECT_FALSE(pool.Take("ns", "base", "sha256:a", kRes).has_value());
  EXPECT_EQ(f.built.load(), 0);
}

TEST(WarmPool, OtherResourcesAreDroppedNotHandedOut) {
  Fixture f;
  WarmPool pool({{"ns", "base", 1}}, f.Builder());
  pool.Start();
  ASSERT_TRUE(WaitReady(pool, 1));
  runtime::Resources bigger = kRes;
  bigger.memory_mib *= 2;
  // The defaults changed after it was built: its limits are not what the create would record.
  EXPECT_FALSE(pool.Take("ns", "base", "sha256:a", bigger).has_value());
  EXPECT_GE(f.destroyed.load(), 1);
}

TEST(WarmPool, ResizeGrowsShrinksAndTurnsOnAPoolThatStartedOff) {
  Fixture f;
  WarmPool pool({{"ns", "base", 0}}, f.Builder());
  pool.Start();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(f.built.load(), 0);

  pool.Resize({{"ns", "base", 3}});
  EXPECT_EQ(pool.Sizes().at("ns/base"), 3);
  ASSERT_TRUE(WaitReady(pool, 3));

  pool.Resize({{"ns", "base", 1}});
  EXPECT_EQ(pool.Ready().at("ns/base"), 1);
  EXPECT_EQ(f.destroyed.load(), f.built.load() - 1);

  // Missing from the new list: turned off, and what it held is destroyed.
  pool.Resize({});
  EXPECT_EQ(pool.Sizes().at("ns/base"), 0);
  EXPECT_TRUE(pool.Ready().empty());
  EXPECT_FALSE(pool.Take("ns", "base", "sha256:a", kRes).has_value());
  EXPECT_TRUE(Eventually([&] { return f.destroyed.load() == f.built.load(); }));
}

TEST(WarmPool, ReturnToAPoolTurnedOffDestroysTheSandbox) {
  Fixture f;
  WarmPool pool({{"ns", "base", 1}}, f.Builder());
  pool.Start();
  ASSERT_TRUE(WaitReady(pool, 1));
  auto sb = pool.Take("ns", "base", "sha256:a", kRes);
  ASSERT_TRUE(sb.has_value());
  pool.Resize({{"ns", "base", 0}});
  pool.Return(std::move(*sb));
  EXPECT_TRUE(pool.Ready().empty());
  // A refill that was under way when the pool was turned off is destroyed when it finishes.
  EXPECT_TRUE(Eventually([&] { return f.destroyed.load() == f.built.load(); }));
}

TEST(WarmPool, FlushDestroysWhatIsReadyAndRefills) {
  Fixture f;
  WarmPool pool({{"ns", "base", 2}}, f.Builder());
  pool.Start();
  ASSERT_TRUE(WaitReady(pool, 2));
  f.pids = 7;
  pool.Flush();
  EXPECT_GE(f.destroyed.load(), 2);
  runtime::Resources now = kRes;
  now.pids = 7;
  ASSERT_TRUE(WaitReady(pool, 2));
  EXPECT_TRUE(pool.Take("ns", "base", "sha256:a", now).has_value());
}

}  // namespace
}  // namespace sbx::service
