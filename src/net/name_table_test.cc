#include "net/name_table.h"

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

NameTable::Clock::time_point g_now{};
NameTable::Clock::time_point FakeNow() { return g_now; }

IpPrefix Addr(const char* a) { return *IpPrefix::Parse(a); }

TEST(NameTable, ResolvedPerSandboxAndNameUntilExpiry) {
  NameTable t;
  t.SetClockForTest(&FakeNow);
  g_now = {};
  t.Record("sb-a", "pypi.org", {Addr("198.18.0.10"), Addr("2001:db8::10")}, std::chrono::seconds(5));
  EXPECT_TRUE(t.Resolved("sb-a", "pypi.org", Addr("198.18.0.10")));
  EXPECT_TRUE(t.Resolved("sb-a", "pypi.org", Addr("2001:db8::10")));
  EXPECT_FALSE(t.Resolved("sb-a", "pypi.org", Addr("198.18.0.11")));
  EXPECT_FALSE(t.Resolved("sb-a", "evil.org", Addr("198.18.0.10")));
  EXPECT_FALSE(t.Resolved("sb-b", "pypi.org", Addr("198.18.0.10")));  // another sandbox's answer
  EXPECT_EQ(t.NamesOf("sb-a", Addr("198.18.0.10")), std::vector<std::string>{"pypi.org"});
  // A TTL of 5 s is kept for the 30 s floor, then expires.
  g_now += std::chrono::seconds(29);
  EXPECT_TRUE(t.Resolved("sb-a", "pypi.org", Addr("198.18.0.10")));
  g_now += std::chrono::seconds(2);
  EXPECT_FALSE(t.Resolved("sb-a", "pypi.org", Addr("198.18.0.10")));
  EXPECT_TRUE(t.NamesOf("sb-a", Addr("198.18.0.10")).empty());
}

TEST(NameTable, LongTtlClampedAndForget) {
  NameTable t;
  t.SetClockForTest(&FakeNow);
  g_now = {};
  t.Record("sb-a", "a.org", {Addr("198.18.0.1")}, std::chrono::hours(48));
  g_now += std::chrono::seconds(3601);
  EXPECT_FALSE(t.Resolved("sb-a", "a.org", Addr("198.18.0.1")));
  t.Record("sb-a", "a.org", {Addr("198.18.0.1")}, std::chrono::seconds(60));
  EXPECT_TRUE(t.Resolved("sb-a", "a.org", Addr("198.18.0.1")));
  t.Forget("sb-a");
  EXPECT_FALSE(t.Resolved("sb-a", "a.org", Addr("198.18.0.1")));
}

TEST(NameTable, BoundedPerSandbox) {
  NameTable t;
  t.SetClockForTest(&FakeNow);
  g_now = {};
  for (size_t i = 0; i <= NameTable::kMaxNamesPerSandbox; ++i) {
    t.Record("sb-a", "n" + std::to_string(i) + ".org", {Addr("198.18.0.1")},
             std::chrono::seconds(60 + static_cast<int>(i)));
  }
  // The first name (the earliest expiry) made room for the last.
  EXPECT_FALSE(t.Resolved("sb-a", "n0.org", Addr("198.18.0.1")));
  EXPECT_TRUE(t.Resolved("sb-a", "n1.org", Addr("198.18.0.1")));
  EXPECT_TRUE(t.Resolved("sb-a", "n" + std::to_string(NameTable::kMaxNamesPerSandbox) + ".org",
                         Addr("198.18.0.1")));
}

}  // namespace
}  // namespace sbx::net
