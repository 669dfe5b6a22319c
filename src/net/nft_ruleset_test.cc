#include "net/nft_ruleset.h"

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

NetPolicyConfig Cfg() {
  return {.pool4 = *IpPrefix::Parse("10.200.0.0/16"),
          .pool6 = *IpPrefix::Parse("fd00:5b::/64"),
          .exempt = {*IpPrefix::Parse("198.18.0.0/15")},
          .uplink = "up0"};
}

size_t Pos(const std::string& text, const std::string& needle) {
  size_t p = text.find(needle);
  EXPECT_NE(p, std::string::npos) << needle << "\nin:\n" << text;
  return p;
}

TEST(NftRuleset, SandboxChainOrder) {
  AddrPool pool = *AddrPool::Make(Cfg().pool4, Cfg().pool6);
  SandboxAddrs a = *pool.Allocate();
  SandboxPolicy pol;
  pol.deny.push_back(*ParseRule(nlohmann::json::parse(R"({"cidr":"198.18.9.0/24"})"), "d"));
  pol.allow.push_back(
      *ParseRule(nlohmann::json::parse(R"({"cidr":"198.18.0.0/15","ports":"80"})"), "a"));
  std::string t = AddSandboxRuleset("sbx_abc", "sbxv0", a, Cfg(), pol);
  // Spoofing, other sandboxes, metadata (never exempt), the exempt-aware blocked ranges, the
  // deny list, then the allow rules, then the final drop.
  size_t spoof = Pos(t, "ip saddr != 10.200.0.2 counter name \"sbx_abc__spoofed\" drop");
  size_t others = Pos(t, "ip daddr 10.200.0.0/16 counter name \"sbx_abc__other_sandbox\"");
  size_t meta = Pos(t, "ip daddr 169.254.169.254/32 counter name \"sbx_abc__metadata\"");
  size_t reserved = Pos(t, "ip daddr != { 198.18.0.0/15 } ip daddr 198.18.0.0/15 counter name \"sbx_abc__reserved\"");
  size_t deny = Pos(t, "ip daddr 198.18.9.0/24 counter name \"sbx_abc__deny_rule\" drop");
  size_t allow_tcp = Pos(t, "ip daddr 198.18.0.0/15 tcp dport 80 accept");
  size_t allow_udp = Pos(t, "ip daddr 198.18.0.0/15 udp dport 80 accept");
  size_t last = Pos(t, "add rule inet sbx sbx_abc counter name \"sbx_abc__not_allowed\" drop");
  EXPECT_LT(spoof, others);
  EXPECT_LT(others, meta);
  EXPECT_LT(meta, reserved);
  EXPECT_LT(reserved, deny);
  EXPECT_LT(deny, allow_tcp);
  EXPECT_LT(allow_tcp, allow_udp);
  EXPECT_LT(allow_udp, last);
  Pos(t, "ip6 saddr != fd00:5b::2 counter name \"sbx_abc__spoofed\" drop");
  Pos(t, "add element inet sbx from_sandbox { \"sbxv0\" : jump sbx_abc }");
  Pos(t, "add rule inet sbx sbx_abc_in counter name \"sbx_abc__host\" drop");
  // The metadata rule carries no exemption.
  EXPECT_EQ(t.find("198.18.0.0/15 } ip daddr 169.254.169.254"), std::string::npos);
}

TEST(NftRuleset, BaseMasqueradesTowardUplink) {
  std::string t = BaseRuleset(Cfg());
  Pos(t, "oifname \"up0\" ip saddr 10.200.0.0/16 masquerade");
  Pos(t, "oifname \"up0\" ip6 saddr fd00:5b::/64 masquerade");
  Pos(t, "iifname \"sbxv*\" drop");
}

TEST(NftRuleset, DeleteRemovesEveryObjectAdded) {
  std::string del = DeleteSandboxRuleset("sbx_abc", "sbxv0");
  for (const auto& reason : DenialReasons()) Pos(del, "delete counter inet sbx sbx_abc__" + reason);
  EXPECT_LT(Pos(del, "delete element inet sbx from_sandbox"), Pos(del, "delete chain inet sbx sbx_abc\n"));
}

TEST(NftRuleset, OnlySandboxIdsAreSafeNames) {
  EXPECT_TRUE(IsSafeName("sbx_0123abc"));
  EXPECT_FALSE(IsSafeName("x\"; flush ruleset"));
  EXPECT_FALSE(IsSafeName(""));
  EXPECT_FALSE(IsSafeName("Sbx"));
}

}  // namespace
}  // namespace sbx::net
