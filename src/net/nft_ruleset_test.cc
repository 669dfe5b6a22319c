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

NetPolicyConfig LabCfg() {
  NetPolicyConfig c = Cfg();
  c.profiles.push_back(*ParseProfile("lab", nlohmann::json::parse(
      R"({"allow":[{"cidr":"198.18.0.0/15","ports":"80"}],"deny":[{"cidr":"198.18.9.0/24"}]})")));
  return c;
}

TEST(NftRuleset, SharedRulesInOrder) {
  std::string t = BaseRuleset(LabCfg());
  // Spoofing, other sandboxes, metadata (never exempt), the exempt-aware blocked ranges, then
  // the profile through the map; each refusal counts, then drops.
  size_t spoof = Pos(t, "add rule inet sbx egress meta nfproto ipv4 iifname . ip saddr != @own4 iifname @deny_spoofed\n");
  Pos(t, "add rule inet sbx egress meta nfproto ipv4 iifname . ip saddr != @own4 drop\n");
  size_t others = Pos(t, "egress ip daddr 10.200.0.0/16 iifname @deny_other_sandbox");
  size_t meta = Pos(t, "egress ip daddr 169.254.169.254/32 iifname @deny_metadata");
  size_t reserved = Pos(t, "egress ip daddr != { 198.18.0.0/15 } ip daddr 198.18.0.0/15 iifname @deny_reserved");
  size_t vmap = Pos(t, "egress iifname vmap @profile_of\n");
  EXPECT_LT(spoof, others);
  EXPECT_LT(others, meta);
  EXPECT_LT(meta, reserved);
  EXPECT_LT(reserved, vmap);
  EXPECT_EQ(t.find("198.18.0.0/15 } ip daddr 169.254.169.254"), std::string::npos);
  // The profile chains: open accepts everything the shared rules let through; lab its rules.
  Pos(t, "add rule inet sbx p_open ip daddr 0.0.0.0/0 accept");
  size_t deny = Pos(t, "p_lab ip daddr 198.18.9.0/24 iifname @deny_deny_rule");
  size_t allow_tcp = Pos(t, "p_lab ip daddr 198.18.0.0/15 tcp dport 80 accept");
  size_t allow_udp = Pos(t, "p_lab ip daddr 198.18.0.0/15 udp dport 80 accept");
  size_t last = Pos(t, "p_lab iifname @deny_not_allowed\nadd rule inet sbx p_lab drop");
  EXPECT_LT(deny, allow_tcp);
  EXPECT_LT(allow_tcp, allow_udp);
  EXPECT_LT(allow_udp, last);
  Pos(t, "input iifname \"sbxv*\" iifname @deny_host\nadd rule inet sbx input iifname \"sbxv*\" drop");
  for (const auto& reason : DenialReasons()) Pos(t, "add set inet sbx deny_" + reason + " { type ifname; counter; }");
}

TEST(NftRuleset, SandboxAddsOnlyElementsUnlessNarrowed) {
  AddrPool pool = *AddrPool::Make(Cfg().pool4, Cfg().pool6);
  SandboxAddrs a = *pool.Allocate();
  std::string t = AddSandboxRuleset("sbx_abc", "sbxv0", a, LabCfg(), {.profile = "lab"});
  EXPECT_EQ(t.find("add rule"), std::string::npos) << t;
  EXPECT_EQ(t.find("add chain"), std::string::npos) << t;
  Pos(t, "add element inet sbx own4 { \"sbxv0\" . 10.200.0.2 }");
  Pos(t, "add element inet sbx own6 { \"sbxv0\" . fd00:5b::2 }");
  Pos(t, "add element inet sbx profile_of { \"sbxv0\" : jump p_lab }");
  for (const auto& reason : DenialReasons()) Pos(t, "add element inet sbx deny_" + reason + " { \"sbxv0\" }");

  std::vector<EgressRule> narrow = {
      *ParseRule(nlohmann::json::parse(R"({"cidr":"198.18.1.0/24","ports":"80","protocol":"tcp"})"), "n")};
  std::string n = AddSandboxRuleset("sbx_abc", "sbxv0", a, LabCfg(), {.profile = "lab", .narrowed = narrow});
  size_t deny = Pos(n, "sbx_abc ip daddr 198.18.9.0/24 iifname @deny_deny_rule");  // the profile's deny stays
  size_t allow = Pos(n, "sbx_abc ip daddr 198.18.1.0/24 tcp dport 80 accept");
  EXPECT_EQ(n.find("sbx_abc ip daddr 198.18.0.0/15"), std::string::npos);  // the profile's allow goes
  EXPECT_LT(deny, allow);
  Pos(n, "add element inet sbx profile_of { \"sbxv0\" : jump sbx_abc }");
}

// A microVM's tap: its guest sends past every qdisc, so with a rate the base ruleset polices
// what comes in on a tap of the `taps` set (forwarded or to the host), before any other rule;
// without a rate nothing is policed; the tap's element comes and goes with its sandbox's.
TEST(NftRuleset, TapsArePolicedAtTheRateBeforeAnyOtherRule) {
  NetPolicyConfig c = LabCfg();
  std::string none = BaseRuleset(c);
  Pos(none, "add set inet sbx taps { type ifname; }");
  EXPECT_EQ(none.find("@tap_rate"), std::string::npos) << none;
  c.rate_mbit = 40;
  std::string t = BaseRuleset(c);
  const std::string police =
      "iifname @taps update @tap_rate { iifname limit rate over 5000000 bytes/second burst 381072 bytes } drop";
  size_t fwd = Pos(t, "add rule inet sbx forward " + police);
  size_t in = Pos(t, "add rule inet sbx input " + police);
  EXPECT_LT(fwd, Pos(t, "add rule inet sbx forward iifname \"sbxv*\" jump egress"));
  EXPECT_LT(in, Pos(t, "add rule inet sbx input iifname \"sbxv*\" ct state established,related accept"));

  AddrPool pool = *AddrPool::Make(Cfg().pool4, Cfg().pool6);
  SandboxAddrs a = *pool.Allocate();
  EXPECT_EQ(AddSandboxRuleset("sbx_abc", "sbxv0", a, c, {.profile = "lab"}).find("taps"), std::string::npos);
  Pos(AddSandboxRuleset("sbx_abc", "sbxv0", a, c, {.profile = "lab"}, /*tap=*/true),
      "add element inet sbx taps { \"sbxv0\" }");
  auto del = DeleteSandboxCommands("sbx_abc", "sbxv0", a, false, /*tap=*/true);
  EXPECT_EQ(del.back(), "delete element inet sbx taps { \"sbxv0\" }");
  for (const auto& cmd : DeleteSandboxCommands("sbx_abc", "sbxv0", a, false)) {
    EXPECT_EQ(cmd.find("taps"), std::string::npos) << cmd;
  }
}

TEST(NftRuleset, BaseMasqueradesTowardUplink) {
  std::string t = BaseRuleset(Cfg());
  Pos(t, "oifname \"up0\" ip saddr 10.200.0.0/16 masquerade");
  Pos(t, "oifname \"up0\" ip6 saddr fd00:5b::/64 masquerade");
  Pos(t, "forward iifname \"sbxv*\" jump egress");
}

TEST(NftRuleset, DeleteRemovesEveryObjectAdded) {
  AddrPool pool = *AddrPool::Make(Cfg().pool4, Cfg().pool6);
  SandboxAddrs a = *pool.Allocate();
  std::string del;
  for (const auto& c : DeleteSandboxCommands("sbx_abc", "sbxv0", a, /*narrowed=*/true)) del += c + "\n";
  for (const auto& reason : DenialReasons()) Pos(del, "delete element inet sbx deny_" + reason + " { \"sbxv0\" }");
  Pos(del, "delete element inet sbx own4 { \"sbxv0\" . 10.200.0.2 }");
  EXPECT_LT(Pos(del, "delete element inet sbx profile_of"), Pos(del, "delete chain inet sbx sbx_abc\n"));
}

TEST(NftRuleset, ProxyRedirectsResolvedTcpAndAcceptsOnlyRedirected) {
  NetPolicyConfig c = LabCfg();
  EXPECT_EQ(BaseRuleset(c).find("redirect"), std::string::npos);  // no proxy port: no rules
  c.proxy_port = 10080;
  std::string t = BaseRuleset(c);
  Pos(t, "add chain inet sbx prerouting { type nat hook prerouting priority dstnat; policy accept; }");
  Pos(t, "add set inet sbx resolved4 { type ifname . ipv4_addr; flags timeout; }");
  Pos(t, "prerouting iifname \"sbxv*\" iifname . ip daddr @resolved4 meta l4proto tcp redirect to :10080");
  Pos(t, "prerouting iifname \"sbxv*\" iifname . ip6 daddr @resolved6 meta l4proto tcp redirect to :10080");
  EXPECT_LT(Pos(t, "flush chain inet sbx prerouting"), Pos(t, "redirect to :10080"));
  // Accepted only when redirected and from the sandbox's own address, before the input drops.
  size_t accept4 = Pos(t, "input iifname \"sbxv*\" meta nfproto ipv4 tcp dport 10080 ct status dnat "
                          "iifname . ip saddr @own4 accept");
  size_t other = Pos(t, "input iifname != \"sbxv*\" iifname != \"lo\" tcp dport 10080 drop");
  size_t drop = Pos(t, "add rule inet sbx input iifname \"sbxv*\" drop");
  EXPECT_LT(accept4, drop);
  EXPECT_LT(other, drop);
}

TEST(NftRuleset, DomainRulesRefuseUdpAfterTheCidrRules) {
  NetPolicyConfig c = Cfg();
  c.profiles.push_back(*ParseProfile("named", nlohmann::json::parse(
      R"({"allow":[{"domain":"pypi.org","ports":"443"},{"cidr":"198.18.0.0/15","ports":"53","protocol":"udp"}]})")));
  std::string t = BaseRuleset(c);
  size_t cidr = Pos(t, "p_named ip daddr 198.18.0.0/15 udp dport 53 accept");
  size_t udp = Pos(t, "p_named meta l4proto udp iifname @deny_udp_domain\nadd rule inet sbx p_named meta l4proto udp drop");
  EXPECT_LT(cidr, udp);
  EXPECT_EQ(t.find("pypi.org"), std::string::npos);  // a domain rule admits nothing by address
  // A CIDR-only profile keeps UDP to its rules and has no udp_domain refusal.
  EXPECT_EQ(t.find("p_lab meta l4proto udp"), std::string::npos);
}

TEST(NftRuleset, OnlySandboxIdsAreSafeNames) {
  EXPECT_TRUE(IsSafeName("sbx_0123abc"));
  EXPECT_FALSE(IsSafeName("x\"; flush ruleset"));
  EXPECT_FALSE(IsSafeName(""));
  EXPECT_FALSE(IsSafeName("Sbx"));
}

}  // namespace
}  // namespace sbx::net
