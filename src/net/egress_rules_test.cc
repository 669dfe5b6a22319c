#include "net/egress_rules.h"

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

using Json = nlohmann::json;

TEST(EgressRules, ParsesCidrPortsAndProtocol) {
  auto r = ParseRule(Json::parse(R"({"cidr":"198.18.0.0/15","ports":"8000-8100","protocol":"tcp"})"), "r");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->port_lo, 8000);
  EXPECT_EQ(r->port_hi, 8100);
  EXPECT_EQ(r->protocol, Protocol::kTcp);
  EXPECT_EQ(r->ToJson().dump(), R"({"cidr":"198.18.0.0/15","ports":"8000-8100","protocol":"tcp"})");
  auto p = ParseRule(Json::parse(R"({"cidr":"::/0","ports":443})"), "r");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->port_lo, 443);
  EXPECT_EQ(p->protocol, Protocol::kAny);
}

TEST(EgressRules, NullIsAKeyLeftOut) {
  auto r = ParseRule(Json::parse(R"({"cidr":"10.0.0.0/8","domain":null,"ports":null,"protocol":null})"), "r");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->any_port());
  EXPECT_EQ(r->protocol, Protocol::kAny);
  auto d = ParseRule(Json::parse(R"({"cidr":null,"domain":"pypi.org"})"), "r");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->domain, "pypi.org");
  // Both null is neither given.
  EXPECT_FALSE(ParseRule(Json::parse(R"({"cidr":null,"domain":null})"), "r").ok());
}

TEST(EgressRules, BadRulesNameTheField) {
  struct Case {
    const char* json;
    const char* needle;
  } cases[] = {
      {R"({"domain":"pypi.org","protocol":"udp"})", "a domain rule is tcp only"},
      {R"({"domain":"10.1.2.3"})", "egress.allow[3].domain"},
      {R"({"cidr":"pypi.org"})", "egress.allow[3].cidr"},
      {R"({"cidr":"10.0.0.0/8","ports":0})", "out of range"},
      {R"({"cidr":"10.0.0.0/8","ports":"70000"})", "out of range"},
      {R"({"cidr":"10.0.0.0/8","ports":"90-80"})", "ends before it starts"},
      {R"({"cidr":"10.0.0.0/8","ports":"8x"})", "not a port number"},
      {R"({"cidr":"10.0.0.0/8","protocol":"icmp"})", "egress.allow[3].protocol"},
      {R"({"cidr":"10.0.0.0/8","via":"x"})", "unknown key 'via'"},
      {R"({})", "\"cidr\""},
      {R"("10.0.0.0/8")", "a rule is an object"},
  };
  for (const auto& c : cases) {
    auto r = ParseRule(Json::parse(c.json), "egress.allow[3]");
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.json << " -> " << r.status();
  }
}

TEST(EgressRules, ProfileFromConfiguration) {
  auto p = ParseProfile("lab", Json::parse(R"({"description":"the lab",
      "allow":[{"cidr":"198.18.0.0/15","ports":"80","protocol":"tcp"}],
      "deny":[{"cidr":"198.18.9.0/24"}]})"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->networked);
  EXPECT_EQ(p->allow.size(), 1u);
  EXPECT_EQ(p->deny.size(), 1u);
  Json j = p->ToJson();
  EXPECT_EQ(j["rules"][0]["action"], "deny");
  EXPECT_EQ(j["rules"][1]["action"], "allow");
  EXPECT_FALSE(ParseProfile("open", Json::object()).ok());
  EXPECT_FALSE(ParseProfile("Bad Name", Json::object()).ok());
  auto dom = ParseProfile("pkgs", Json::parse(R"({"allow":[{"domain":"*.pythonhosted.org"}]})"));
  ASSERT_TRUE(dom.ok()) << dom.status();
  EXPECT_EQ(dom->allow[0].domain, "*.pythonhosted.org");
  auto bad = ParseProfile("pkgs", Json::parse(R"({"allow":[{"domain":"*.python*.org"}]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("egress.profiles.pkgs.allow[0].domain"), std::string::npos);
}

TEST(EgressRules, NarrowingMayNotWiden) {
  auto lab = *ParseProfile("lab", Json::parse(
      R"({"allow":[{"cidr":"198.18.0.0/15","ports":"80-90","protocol":"tcp"},
                   {"cidr":"198.19.5.0/24","protocol":"udp"}]})"));
  auto ok = ParseNarrowing(lab, Json::parse(
      R"({"allow":[{"cidr":"198.18.1.0/24","ports":"80","protocol":"tcp"},
                   {"cidr":"198.19.5.7","ports":"53","protocol":"udp"}]})"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);
  const char* widen[] = {
      R"({"allow":[{"cidr":"198.16.0.0/12","ports":"80","protocol":"tcp"}]})",  // wider range
      R"({"allow":[{"cidr":"198.18.1.0/24","ports":"80-100","protocol":"tcp"}]})",  // ports
      R"({"allow":[{"cidr":"198.18.1.0/24","ports":"80","protocol":"udp"}]})",  // protocol
      R"({"allow":[{"cidr":"198.18.1.0/24","ports":"80"}]})",  // any protocol
      R"({"allow":[{"cidr":"198.18.1.0/24","protocol":"tcp"}]})",  // every port
  };
  for (const char* w : widen) {
    auto r = ParseNarrowing(lab, Json::parse(w));
    ASSERT_FALSE(r.ok()) << w;
    EXPECT_NE(r.status().message().find("egress.allow[0]"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("widen"), std::string::npos) << r.status();
  }
  EXPECT_TRUE(ParseNarrowing(OpenProfile(), Json::parse(R"({"allow":[{"cidr":"1.1.1.1"}]})")).ok());
  EXPECT_FALSE(ParseNarrowing(NoneProfile(), Json::parse(R"({"allow":[]})")).ok());
  EXPECT_FALSE(ParseNarrowing(lab, Json::parse(R"({"deny":[]})")).ok());
}

TEST(EgressRules, AlwaysBlockedCoversTheIssuesRanges) {
  auto blocked = [](const char* addr) {
    auto a = *IpPrefix::Parse(addr);
    for (const auto& b : AlwaysBlocked()) {
      if (b.range.Contains(a)) return b.reason;
    }
    return std::string("open");
  };
  EXPECT_EQ(blocked("169.254.169.254"), "metadata");
  EXPECT_EQ(blocked("fd00:ec2::254"), "metadata");
  EXPECT_EQ(blocked("127.0.0.1"), "loopback");
  EXPECT_EQ(blocked("::1"), "reserved");
  EXPECT_EQ(blocked("10.1.2.3"), "private");
  EXPECT_EQ(blocked("192.168.1.1"), "private");
  EXPECT_EQ(blocked("100.100.100.100"), "cgnat");
  EXPECT_EQ(blocked("224.0.0.1"), "multicast");
  EXPECT_EQ(blocked("ff02::1"), "multicast");
  EXPECT_EQ(blocked("fe80::1"), "link_local");
  EXPECT_EQ(blocked("192.0.2.1"), "documentation");
  EXPECT_EQ(blocked("2001:db8::1"), "documentation");
  EXPECT_EQ(blocked("1.1.1.1"), "open");
  EXPECT_EQ(blocked("2606:4700::1111"), "open");
}

TEST(EgressRules, DomainRulesParseNormalizedAndTcpOnly) {
  auto r = ParseRule(Json::parse(R"({"domain":"PyPI.org.","ports":443})"), "r");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->domain, "pypi.org");
  EXPECT_EQ(r->protocol, Protocol::kTcp);
  EXPECT_EQ(r->ToJson().dump(), R"({"domain":"pypi.org","ports":"443","protocol":"tcp"})");
  auto w = ParseRule(Json::parse(R"({"domain":"*.pythonhosted.org"})"), "r");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->domain, "*.pythonhosted.org");
  for (const char* bad : {R"({"domain":"pypi.org","protocol":"udp"})",
                          R"({"domain":"pypi.org","protocol":"any"})",
                          R"({"domain":"1.2.3.4"})", R"({"domain":"*"})", R"({"domain":"a.*.org"})",
                          R"({"domain":"*.*.org"})", R"({"domain":"bad name.org"})",
                          R"({"domain":"a..org"})", R"({"domain":""})", R"({"domain":7})",
                          R"({"domain":"pypi.org","cidr":"1.2.3.0/24"})", R"({"ports":443})"}) {
    auto st = ParseRule(Json::parse(bad), "egress.allow[0]");
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.status().message().find("egress.allow[0]"), std::string::npos) << st.status();
  }
  EXPECT_FALSE(ParseRule(Json{{"domain", std::string(64, 'a') + ".org"}}, "r").ok());
}

TEST(EgressRules, DomainMatchingAndWithin) {
  auto rule = [](const char* j) { return *ParseRule(Json::parse(j), "r"); };
  EgressRule exact = rule(R"({"domain":"pypi.org","ports":443})");
  EgressRule wild = rule(R"({"domain":"*.pythonhosted.org"})");
  EXPECT_TRUE(exact.Matches("pypi.org", 443));
  EXPECT_TRUE(exact.Matches("pypi.org", 0));
  EXPECT_FALSE(exact.Matches("pypi.org", 80));
  EXPECT_FALSE(exact.Matches("evilpypi.org", 443));
  EXPECT_FALSE(exact.Matches("a.pypi.org", 443));
  EXPECT_TRUE(wild.Matches("files.pythonhosted.org", 443));
  EXPECT_TRUE(wild.Matches("a.b.pythonhosted.org", 80));
  EXPECT_FALSE(wild.Matches("pythonhosted.org", 443));
  EXPECT_FALSE(wild.Matches("evilpythonhosted.org", 443));
  // Narrowing: a domain lies within a wider pattern or a rule of every address, never a range.
  EXPECT_TRUE(rule(R"({"domain":"files.pythonhosted.org"})").WithinRule(wild));
  EXPECT_TRUE(rule(R"({"domain":"*.a.pythonhosted.org"})").WithinRule(wild));
  EXPECT_FALSE(rule(R"({"domain":"pythonhosted.org"})").WithinRule(wild));
  EXPECT_FALSE(wild.WithinRule(rule(R"({"domain":"files.pythonhosted.org"})")));
  EXPECT_FALSE(rule(R"({"domain":"pypi.org"})").WithinRule(exact));  // every port within 443: no
  EXPECT_TRUE(exact.WithinRule(rule(R"({"cidr":"0.0.0.0/0"})")));
  EXPECT_FALSE(exact.WithinRule(rule(R"({"cidr":"198.18.0.0/15"})")));
  EXPECT_FALSE(exact.WithinRule(rule(R"({"cidr":"0.0.0.0/0","protocol":"udp"})")));
  EXPECT_FALSE(rule(R"({"cidr":"0.0.0.0/0"})").WithinRule(wild));
}

TEST(EgressRules, NameAllowedDenyFirstAndOpenResolvesAll) {
  auto rules = [](const char* j) { return *ParseRules(Json::parse(j), "r"); };
  auto allow = rules(R"([{"domain":"pypi.org","ports":443},{"domain":"*.example.com"},
                         {"cidr":"198.18.0.0/15"}])");
  auto deny = rules(R"([{"domain":"bad.example.com"},{"domain":"slow.example.com","ports":80}])");
  EXPECT_TRUE(NameAllowed(allow, deny, "pypi.org", 443));
  EXPECT_TRUE(NameAllowed(allow, deny, "pypi.org", 0));
  EXPECT_FALSE(NameAllowed(allow, deny, "pypi.org", 80));
  EXPECT_FALSE(NameAllowed(allow, deny, "bad.example.com", 0));
  EXPECT_FALSE(NameAllowed(allow, deny, "bad.example.com", 443));
  EXPECT_TRUE(NameAllowed(allow, deny, "slow.example.com", 0));   // resolvable: port 443 allowed
  EXPECT_FALSE(NameAllowed(allow, deny, "slow.example.com", 80));
  EXPECT_FALSE(NameAllowed(allow, deny, "other.org", 0));  // a CIDR rule resolves no name
  EXPECT_TRUE(HasDomainRules(allow));
  EXPECT_FALSE(HasDomainRules(OpenProfile().allow));
  EXPECT_TRUE(NameAllowed(OpenProfile().allow, {}, "anything.org", 0));
  EXPECT_EQ(NormalizeName("WWW.Example.COM."), "www.example.com");
  EXPECT_EQ(NormalizeName("10.0.0.1"), "");
  EXPECT_EQ(NormalizeName("."), "");
}

}  // namespace
}  // namespace sbx::net
