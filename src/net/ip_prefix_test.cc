#include "net/ip_prefix.h"

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

TEST(IpPrefix, ParsesBothFamiliesAndBareAddresses) {
  auto a = IpPrefix::Parse("203.0.113.0/24");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->is_v4());
  EXPECT_EQ(a->len, 24);
  EXPECT_EQ(a->ToString(), "203.0.113.0/24");
  auto b = IpPrefix::Parse("2001:db8::1");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->len, 128);
  EXPECT_EQ(b->ToString(), "2001:db8::1/128");
}

TEST(IpPrefix, RejectsBadInputNamingIt) {
  for (const char* bad : {"", "/8", "10.0.0.0/", "10.0.0.0/33", "::/129", "10.0.0/8",
                          "example.org", "10.0.0.0/8x", "10.0.0.0/-1", "1.2.3.4/0008"}) {
    auto p = IpPrefix::Parse(bad);
    EXPECT_FALSE(p.ok()) << bad;
  }
  auto p = IpPrefix::Parse("10.0.0.1/8");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("did you mean 10.0.0.0/8"), std::string::npos)
      << p.status();
}

TEST(IpPrefix, ContainsAndOffset) {
  auto net = *IpPrefix::Parse("10.200.0.0/16");
  EXPECT_TRUE(net.Contains(*IpPrefix::Parse("10.200.3.0/24")));
  EXPECT_FALSE(net.Contains(*IpPrefix::Parse("10.201.0.0/24")));
  EXPECT_FALSE(net.Contains(*IpPrefix::Parse("10.0.0.0/8")));
  EXPECT_FALSE(net.Contains(*IpPrefix::Parse("::/0")));
  EXPECT_TRUE(IpPrefix::Parse("0.0.0.0/0")->Contains(net));
  EXPECT_EQ(net.Offset(258, 30).ToString(), "10.200.1.2/30");
  auto v6 = *IpPrefix::Parse("fd00:5b::/64");
  EXPECT_EQ(v6.Offset(0x10001, 126).ToString(), "fd00:5b::1:1/126");
}

}  // namespace
}  // namespace sbx::net
