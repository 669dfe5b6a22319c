#include "net/dns_policy.h"

#include <gtest/gtest.h>

#include "net/nft_ruleset.h"

namespace sbx::net {
namespace {

IpPrefix Addr(const char* text) { return *IpPrefix::Parse(text); }

std::vector<EgressRule> Rules(const char* json) {
  auto r = ParseRules(nlohmann::json::parse(json), "test");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<EgressRule>{};
}

NetPolicyConfig Cfg() {
  return {.pool4 = Addr("10.200.0.0/16"),
          .pool6 = Addr("fd00:5b::/64"),
          .exempt = {Addr("198.18.0.0/15"), Addr("10.9.0.0/16")},
          .operator_deny = {Addr("45.0.0.0/24")},
          .uplink = "up0",
          .dns_port = 10053};
}

TEST(DnsPolicy, ResolvesExactlyTheAllowedNames) {
  const auto allow = Rules(R"([{"domain":"pypi.org","ports":"443"},{"domain":"*.pythonhosted.org"}])");
  const auto deny = Rules(R"([{"domain":"evil.pythonhosted.org"}])");
  EXPECT_TRUE(MayResolve(allow, deny, "pypi.org"));
  EXPECT_TRUE(MayResolve(allow, deny, "files.pythonhosted.org"));
  EXPECT_FALSE(MayResolve(allow, deny, "pythonhosted.org"));
  EXPECT_FALSE(MayResolve(allow, deny, "evil.pythonhosted.org"));
  EXPECT_FALSE(MayResolve(allow, deny, "www.pypi.org"));
  EXPECT_FALSE(MayResolve(allow, deny, "example.com"));
  EXPECT_FALSE(MayResolve(allow, deny, ""));
  // `open` resolves every name; a CIDR-only allow-list none (NameAllowed: DNS tunnelling).
  EXPECT_TRUE(MayResolve(OpenProfile().allow, {}, "anything.example"));
  EXPECT_FALSE(MayResolve(Rules(R"([{"cidr":"198.18.0.0/15"}])"), {}, "anything.example"));
}

TEST(DnsPolicy, AnswerAddressesCheckedAsPacketsWouldBe) {
  const NetPolicyConfig c = Cfg();
  EXPECT_EQ(RefusedAnswerReason(c, Addr("93.184.216.34")), "");
  EXPECT_EQ(RefusedAnswerReason(c, Addr("198.18.0.7")), "");  // exempt lab range
  EXPECT_EQ(RefusedAnswerReason(c, Addr("10.9.1.1")), "");     // exempt part of 10/8
  EXPECT_EQ(RefusedAnswerReason(c, Addr("10.0.0.5")), "private");
  EXPECT_EQ(RefusedAnswerReason(c, Addr("127.0.0.1")), "loopback");
  EXPECT_EQ(RefusedAnswerReason(c, Addr("169.254.169.254")), "metadata");
  EXPECT_EQ(RefusedAnswerReason(c, Addr("fd00:ec2::254")), "metadata");
  EXPECT_EQ(RefusedAnswerReason(c, Addr("10.200.0.6")), kReasonSandbox);
  EXPECT_EQ(RefusedAnswerReason(c, Addr("fd00:5b::2")), kReasonSandbox);
  EXPECT_EQ(RefusedAnswerReason(c, Addr("45.0.0.9")), kReasonDenyRule);
  EXPECT_EQ(RefusedAnswerReason(c, Addr("203.0.113.9")), "documentation");
}

TEST(DnsPolicy, ForgedAddressesStrippedChainKept) {
  using dns::Record;
  std::vector<Record> chain = {
      {"pypi.org", dns::kTypeCname, 7200, {}, "cdn.example.net"},
      {"cdn.example.net", dns::kTypeA, 300, Addr("93.184.216.34"), ""},
      {"cdn.example.net", dns::kTypeA, 300, Addr("169.254.169.254"), ""},
      {"cdn.example.net", dns::kTypeA, 5, Addr("10.0.0.5"), ""},
      {"cdn.example.net", dns::kTypeA, 300, Addr("93.184.216.34"), ""},
  };
  CheckedAnswer a = CheckAnswer(Cfg(), chain);
  ASSERT_EQ(a.records.size(), 3u);
  EXPECT_EQ(a.records[0].ttl, kDnsMaxTtl);  // capped
  ASSERT_EQ(a.addrs.size(), 1u);
  EXPECT_EQ(a.addrs[0], Addr("93.184.216.34"));
  ASSERT_EQ(a.stripped.size(), 2u);
  EXPECT_EQ(a.stripped[0].second, "metadata");
  EXPECT_EQ(a.stripped[1].second, "private");
  // The stripped record's short TTL does not count; the floor is NameTable's.
  EXPECT_EQ(a.ttl, 300u);
  std::vector<Record> short_ttl = {{"a.org", dns::kTypeA, 2, Addr("93.184.216.34"), ""}};
  EXPECT_EQ(CheckAnswer(Cfg(), short_ttl).ttl, kDnsMinTtl);
}

TEST(DnsPolicy, Upstreams) {
  auto u = ParseUpstreams("198.18.0.53, 198.18.0.54:5353,[2001:db8::53]:53, 2001:db8::1", "egress.dns_upstream");
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_EQ(u->size(), 4u);
  EXPECT_EQ((*u)[1].port, 5353);
  EXPECT_EQ((*u)[2].ToString(), "[2001:db8::53]:53");
  EXPECT_EQ((*u)[3].port, 53);
  EXPECT_TRUE(ParseUpstreams("", "x")->empty());
  for (const char* bad : {"pypi.org", "1.2.3.4:0", "1.2.3.4:70000", "[::1", "10.0.0.0/8", "1.2.3.4:x"}) {
    auto r = ParseUpstreams(bad, "egress.dns_upstream");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("egress.dns_upstream"), std::string::npos);
    }
  }
  auto host = UpstreamsOfResolvConf("# c\nsearch corp\nnameserver 10.0.0.53\nnameserver fe80::1%eth0\n"
                                    "nameserver ::1\nnameserver 1.1.1.1\nnameserver 8.8.8.8\n");
  ASSERT_EQ(host.size(), 3u);
  EXPECT_EQ(host[1].addr, Addr("::1"));
}

TEST(DnsPolicy, SandboxResolvConfNamesTheHostEnd) {
  const std::string t = SandboxResolvConf(Addr("10.200.0.1"), Addr("fd00:5b::1"));
  EXPECT_NE(t.find("nameserver 10.200.0.1\nnameserver fd00:5b::1\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("search"), std::string::npos);
}

TEST(DnsRuleset, RedirectInputAndDomainRuledChains) {
  NetPolicyConfig c = Cfg();
  c.profiles.push_back(*ParseProfile("pypi", nlohmann::json::parse(
      R"({"allow":[{"domain":"pypi.org"},{"cidr":"198.18.0.0/15","ports":"53","protocol":"udp"}]})")));
  const std::string t = BaseRuleset(c);
  auto pos = [&](const std::string& needle) {
    const size_t p = t.find(needle);
    EXPECT_NE(p, std::string::npos) << needle << "\nin:\n" << t;
    return p;
  };
  pos("add chain inet sbx prerouting { type nat hook prerouting priority dstnat; policy accept; }");
  pos("add set inet sbx resolved4 { type ifname . ipv4_addr; flags timeout; }");
  pos("prerouting iifname \"sbxv*\" fib daddr type local udp dport 53 redirect to :10053");
  pos("prerouting iifname \"sbxv*\" fib daddr type local tcp dport 53 redirect to :10053");
  const size_t accept = pos("input iifname \"sbxv*\" meta nfproto ipv4 ct status dnat udp dport 10053 "
                            "iifname . ip saddr @own4 accept");
  pos("input iifname \"sbxv*\" meta nfproto ipv6 ct status dnat tcp dport 10053 "
      "iifname . ip6 saddr @own6 accept");
  const size_t drop = pos("input iifname \"sbxv*\" drop");
  EXPECT_LT(accept, drop);
  // The domain-ruled chain refuses DNS elsewhere before its CIDR rule for port 53 allows it.
  const size_t other = pos("p_pypi udp dport 53 iifname @deny_dns_other");
  const size_t cidr = pos("p_pypi ip daddr 198.18.0.0/15 udp dport 53 accept");
  EXPECT_LT(other, cidr);
  pos("p_pypi iifname @deny_unresolved_address\nadd rule inet sbx p_pypi drop");
  // `open` is not domain-ruled: DNS to an allowed address is just traffic.
  EXPECT_EQ(t.find("p_open udp dport 53"), std::string::npos);
  pos("p_open iifname @deny_not_allowed");
  // No resolver: no redirect, and DNS to the host is dropped like the rest.
  c.dns_port = 0;
  EXPECT_EQ(BaseRuleset(c).find("redirect"), std::string::npos);
}

TEST(DnsRuleset, ResolvedElementsRefreshTheirTimeout) {
  const std::string t = AddResolvedCommands(
      "sbxv3", {Addr("93.184.216.34"), Addr("2001:db8::7"), Addr("198.18.0.7")}, 300);
  EXPECT_NE(t.find("add element inet sbx resolved4 { \"sbxv3\" . 93.184.216.34, \"sbxv3\" . 198.18.0.7 }\n"
                   "delete element inet sbx resolved4 { \"sbxv3\" . 93.184.216.34, \"sbxv3\" . 198.18.0.7 }\n"
                   "add element inet sbx resolved4 { \"sbxv3\" . 93.184.216.34 timeout 300s, \"sbxv3\" . 198.18.0.7 timeout 300s }\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("resolved6 { \"sbxv3\" . 2001:db8::7 timeout 300s }"), std::string::npos) << t;
  EXPECT_EQ(AddResolvedCommands("sbxv3", {}, 300), "");
}

}  // namespace
}  // namespace sbx::net
