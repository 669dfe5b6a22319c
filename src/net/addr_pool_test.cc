#include "net/addr_pool.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace sbx::net {
namespace {

AddrPool SmallPool() {
  // A /28 holds four /30s; the IPv6 /64 many more: the smaller one decides.
  return *AddrPool::Make(*IpPrefix::Parse("10.200.0.0/28"), *IpPrefix::Parse("fd00:5b::/64"));
}

TEST(AddrPool, HandsOutDisjointSubnetsUntilFull) {
  AddrPool pool = SmallPool();
  ASSERT_EQ(pool.capacity(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    auto a = pool.Allocate();
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->slot, i);
    EXPECT_EQ(a->host4.ToString(), fmt::format("10.200.0.{}/30", 4 * i + 1));
    EXPECT_EQ(a->sandbox4.ToString(), fmt::format("10.200.0.{}/30", 4 * i + 2));
    EXPECT_EQ(a->sandbox6.ToString(), fmt::format("fd00:5b::{:x}/126", 4 * i + 2));
  }
  auto full = pool.Allocate();
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  pool.Release(2);
  auto again = pool.Allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->slot, 2u);
}

TEST(AddrPool, ReservedSlotsAreNotHandedOutAgain) {
  AddrPool pool = SmallPool();
  ASSERT_TRUE(pool.Reserve(0).ok());
  ASSERT_TRUE(pool.Reserve(1).ok());
  EXPECT_EQ(pool.Reserve(1).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(pool.Reserve(9).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Allocate()->slot, 2u);
  EXPECT_EQ(pool.in_use(), 3u);
}

TEST(AddrPool, ReleasedSlotIsReusedLast) {
  AddrPool pool = SmallPool();
  ASSERT_EQ(pool.Allocate()->slot, 0u);
  pool.Release(0);
  EXPECT_EQ(pool.Allocate()->slot, 1u);
}

TEST(AddrPool, RejectsRangesTooSmallOrWrongFamily) {
  auto v6 = *IpPrefix::Parse("fd00:5b::/64");
  EXPECT_FALSE(AddrPool::Make(*IpPrefix::Parse("10.0.0.0/30"), v6).ok());
  EXPECT_FALSE(AddrPool::Make(v6, v6).ok());
  EXPECT_FALSE(AddrPool::Make(*IpPrefix::Parse("10.0.0.0/16"), *IpPrefix::Parse("fd00::/127")).ok());
  auto big = AddrPool::Make(*IpPrefix::Parse("10.0.0.0/8"), v6);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->capacity(), AddrPool::kMaxSlots);
}

TEST(AddrPool, VethNamesRoundTripAndFitIfnamsiz) {
  EXPECT_EQ(VethName(0), "sbxv0");
  EXPECT_LE(VethName(AddrPool::kMaxSlots - 1).size(), 15u);
  EXPECT_EQ(SlotOfVethName(VethName(0xabcde)), 0xabcdeu);
  EXPECT_FALSE(SlotOfVethName("sbxv").has_value());
  EXPECT_FALSE(SlotOfVethName("sbxv01").has_value());
  EXPECT_FALSE(SlotOfVethName("sbxvA").has_value());
  EXPECT_FALSE(SlotOfVethName("eth0").has_value());
}

}  // namespace
}  // namespace sbx::net
