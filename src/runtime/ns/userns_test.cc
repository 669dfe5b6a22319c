#include "runtime/ns/userns.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

class UidRangesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-uidranges-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ranges_ = UidRanges(root_ + "/claims");
    ASSERT_TRUE(ranges_.Init().ok());
    sandboxes_ = root_ + "/sandboxes";
    ASSERT_TRUE(MkdirAll(sandboxes_, 0700).ok());
  }
  void TearDown() override { (void)RemoveTree(root_); }

  std::string Owner(const std::string& id) {
    std::string dir = sandboxes_ + "/" + id;
    EXPECT_TRUE(MkdirAll(dir, 0700).ok());
    return dir;
  }
  bool Claimed(uint32_t base) {
    struct stat st;
    return ::stat(fmt::format("{}/claims/{}", root_, base).c_str(), &st) == 0;
  }

  std::string root_, sandboxes_;
  UidRanges ranges_;
};

TEST_F(UidRangesTest, ClaimsAreDistinctAlignedAndReleasedOnlyByTheirOwner) {
  std::set<uint32_t> bases;
  for (int i = 0; i < 50; ++i) {
    auto b = ranges_.Claim(Owner(fmt::format("sbx_{}", i)));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_GE(*b, kUidRangeFirst);
    EXPECT_LT(*b, kUidRangeEnd);
    EXPECT_EQ((*b - kUidRangeFirst) % kUidRangeSize, 0u);
    bases.insert(*b);
  }
  EXPECT_EQ(bases.size(), 50u);
  const uint32_t b0 = *bases.begin();
  EXPECT_TRUE(ranges_.Release(b0, "/somebody/else").ok());
  EXPECT_TRUE(Claimed(b0)) << "released by a stranger";
}

TEST_F(UidRangesTest, ReclaimAndSweep) {
  const std::string a = Owner("sbx_a"), b = Owner("sbx_b");
  auto ba = ranges_.Claim(a);
  auto bb = ranges_.Claim(b);
  ASSERT_TRUE(ba.ok() && bb.ok());
  EXPECT_TRUE(ranges_.Reclaim(*ba, a).ok());          // already ours
  EXPECT_FALSE(ranges_.Reclaim(*ba, b).ok());         // someone else's
  EXPECT_FALSE(ranges_.Reclaim(kUidRangeFirst + 1, a).ok());  // not a range base

  // A claim of another sbxd whose owner still exists stays; one whose owner is gone goes.
  const std::string foreign = root_ + "/other-sbxd/sandboxes/sbx_x";
  ASSERT_TRUE(MkdirAll(foreign, 0700).ok());
  auto bf = ranges_.Claim(foreign);
  auto bgone = ranges_.Claim(root_ + "/gone/sbx_y");
  ASSERT_TRUE(bf.ok() && bgone.ok());

  // Known: a. Unknown: b (ours, not in the store).
  ASSERT_TRUE(ranges_.Sweep(sandboxes_, {"sbx_a"}).ok());
  EXPECT_TRUE(Claimed(*ba));
  EXPECT_FALSE(Claimed(*bb));
  EXPECT_TRUE(Claimed(*bf));
  EXPECT_FALSE(Claimed(*bgone));

  EXPECT_TRUE(ranges_.ReleaseOwner(a).ok());
  EXPECT_FALSE(Claimed(*ba));
}

TEST_F(UidRangesTest, TransferIsAtomicAndChecksTheHolder) {
  const std::string pool = root_ + "/pool", a = Owner("sbx_a");
  ASSERT_TRUE(MkdirAll(pool, 0700).ok());
  auto b = ranges_.Claim(pool);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(ranges_.Transfer(*b, "/not/the/holder", a).ok());
  ASSERT_TRUE(ranges_.Transfer(*b, pool, a).ok());
  EXPECT_TRUE(ranges_.Release(*b, pool).ok());  // no longer the pool's: stays
  EXPECT_TRUE(Claimed(*b));
  EXPECT_TRUE(ranges_.Release(*b, a).ok());
  EXPECT_FALSE(Claimed(*b));
  auto names = ListDir(root_ + "/claims");
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty()) << "temporary files left behind";
}

// A claim is never visible without its owner: another sbxd's sweep, running while this one
// claims, must not take a fresh claim for stale. (Claims were once created empty and written
// afterwards; a sbxd starting next to a filling pool swept one, and a create failed.)
TEST_F(UidRangesTest, ConcurrentSweepNeverRemovesAFreshClaim) {
  const std::string pool = root_ + "/pool", a = Owner("sbx_a");
  ASSERT_TRUE(MkdirAll(pool, 0700).ok());
  const std::string other_sandboxes = root_ + "/other-sbxd/sandboxes";
  ASSERT_TRUE(MkdirAll(other_sandboxes, 0700).ok());
  std::atomic<bool> done{false};
  std::atomic<int> sweeps{0};
  std::thread sweeper([&] {
    while (!done.load()) {
      ASSERT_TRUE(ranges_.Sweep(other_sandboxes, {}).ok());
      sweeps.fetch_add(1);
    }
  });
  int lost = 0;
  for (int i = 0; i < 3000; ++i) {
    auto b = ranges_.Claim(pool);
    ASSERT_TRUE(b.ok()) << b.status();
    if (!ranges_.Transfer(*b, pool, a).ok()) ++lost;
    ASSERT_TRUE(ranges_.Release(*b, a).ok());
  }
  done = true;
  sweeper.join();
  EXPECT_EQ(lost, 0) << "claims swept while fresh, with " << sweeps.load() << " sweeps";
  EXPECT_GT(sweeps.load(), 0);
}

TEST_F(UidRangesTest, PoolHandsOutTransferredClaimsAndReleasesTheRest) {
  if (::geteuid() != 0) SBX_SKIP_OR_FAIL("user namespace creation with maps needs root");
  const std::string pool_owner = root_ + "/uid-pool";
  ASSERT_TRUE(MkdirAll(pool_owner, 0700).ok());
  std::set<uint32_t> pooled_bases;
  {
    UsernsPool pool(&ranges_, pool_owner, 3);
    pool.Start();
    for (int i = 0; i < 200 && pool.ready() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(pool.ready(), 3);
    const std::string a = Owner("sbx_a");
    auto u = pool.Take(a);
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_GE(u->fd.get(), 0);
    EXPECT_TRUE(Claimed(u->base));
    // Now the sandbox's: the pool's release at destruction must leave it.
    EXPECT_TRUE(ranges_.Release(u->base, pool_owner).ok());
    EXPECT_TRUE(Claimed(u->base));
    pooled_bases.insert(u->base);
    // An empty pool (size 0) still serves, inline.
    UsernsPool empty(&ranges_, pool_owner, 0);
    auto v = empty.Take(Owner("sbx_b"));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_NE(v->base, u->base);
  }
  // Destruction released the two unused pooled claims; the two taken ones remain.
  auto names = ListDir(root_ + "/claims");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 2u);
}

// Concurrent creates from several threads: each holder child must end even though other
// threads clone theirs at the same time (a pipe-EOF design deadlocked exactly here).
TEST(UserNamespace, ConcurrentCreationNeverHangsAndMapsTheRange) {
  if (::geteuid() != 0) SBX_SKIP_OR_FAIL("user namespace creation with maps needs root");
  auto run = std::async(std::launch::async, [] {
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([t, &failures] {
        for (int i = 0; i < 25; ++i) {
          auto ns = MakeUserNamespace(kUidRangeFirst + static_cast<uint32_t>(t) * kUidRangeSize);
          if (!ns.ok()) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    return failures.load();
  });
  if (run.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    // The future's destructor would wait for the hung threads: end the test binary instead.
    std::fprintf(stderr, "FAILED: MakeUserNamespace hung under concurrency\n");
    std::_Exit(1);
  }
  EXPECT_EQ(run.get(), 0);
  auto ns = MakeUserNamespace(kUidRangeFirst);
  ASSERT_TRUE(ns.ok()) << ns.status();
  EXPECT_GE(ns->get(), 0);
}

}  // namespace
}  // namespace sbx::runtime::ns
