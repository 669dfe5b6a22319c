// The pure parts of a PATCH of egress rules and of the limits: the ruleset a PATCH runs, the
// connection-limit rules, the rate parameters and the reading of a conntrack dump message.
#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include "net/conntrack.h"
#include "net/limits.h"
#include "net/nft_ruleset.h"

namespace sbx::net {
namespace {

NetPolicyConfig LabCfg() {
  NetPolicyConfig c{.pool4 = *IpPrefix::Parse("10.200.0.0/16"),
                    .pool6 = *IpPrefix::Parse("fd00:5b::/64"),
                    .exempt = {*IpPrefix::Parse("198.18.0.0/15")},
                    .uplink = "up0"};
  c.profiles.push_back(*ParseProfile("lab", nlohmann::json::parse(
      R"({"allow":[{"cidr":"198.18.0.0/15","ports":"80"}],"deny":[{"cidr":"198.18.9.0/24"}]})")));
  return c;
}

size_t Pos(const std::string& text, const std::string& needle) {
  size_t p = text.find(needle);
  EXPECT_NE(p, std::string::npos) << needle << "\nin:\n" << text;
  return p;
}

std::vector<EgressRule> Rules(const char* json) {
  return *ParseRules(nlohmann::json::parse(json), "allow");
}

TEST(PatchRuleset, FirstPatchMakesTheChainAndRepointsTheMap) {
  std::string t = PatchSandboxRuleset("sbx_abc", "sbxv3", LabCfg(), "lab",
                                      Rules(R"([{"cidr":"198.18.1.0/24","ports":"80","protocol":"tcp"}])"),
                                      /*has_own_chain=*/false);
  size_t flush = Pos(t, "add chain inet sbx sbx_abc\nflush chain inet sbx sbx_abc\n");
  size_t deny = Pos(t, "sbx_abc ip daddr 198.18.9.0/24 iifname @deny_deny_rule");
  size_t allow = Pos(t, "sbx_abc ip daddr 198.18.1.0/24 tcp dport 80 accept");
  size_t del = Pos(t, "delete element inet sbx profile_of { \"sbxv3\" }\n");
  size_t add = Pos(t, "add element inet sbx profile_of { \"sbxv3\" : jump sbx_abc }\n");
  EXPECT_LT(flush, deny);
  EXPECT_LT(deny, allow);
  EXPECT_LT(allow, del);
  EXPECT_LT(del, add);
  Pos(t, "sbx_abc iifname @deny_not_allowed\nadd rule inet sbx sbx_abc drop\n");
}

TEST(PatchRuleset, LaterPatchOnlyRefillsTheChain) {
  std::string t = PatchSandboxRuleset("sbx_abc", "sbxv3", LabCfg(), "lab", {}, /*has_own_chain=*/true);
  EXPECT_EQ(t.find("profile_of"), std::string::npos) << t;
  EXPECT_EQ(t.find("accept"), std::string::npos) << t;  // no allow rule: everything refused
  Pos(t, "flush chain inet sbx sbx_abc\n");
  Pos(t, "sbx_abc drop\n");
}

TEST(ConnLimit, SharedRuleBeforeTheProfileVerdict) {
  NetPolicyConfig c = LabCfg();
  EXPECT_EQ(ConnLimitRules(c), "");
  EXPECT_EQ(BaseRuleset(c).find("ct count"), std::string::npos);
  c.max_connections = 64;
  std::string t = BaseRuleset(c);
  size_t set = Pos(t, "add set inet sbx conns { type ifname; size 1048576; flags dynamic; }");
  // One evaluation of `ct count` per packet, then the refusal in a chain of its own.
  size_t jump = Pos(t, "egress ct state new add @conns { iifname ct count over 64 } jump conn_limit\n");
  size_t log = Pos(t, "conn_limit add @lograte { iifname limit rate 10/second burst 20 packets } log prefix \"sbx conn_limit\" group 1469 snaplen 64\n");
  size_t count = Pos(t, "conn_limit  iifname @deny_conn_limit\n");
  size_t drop = Pos(t, "conn_limit  drop\n");
  size_t vmap = Pos(t, "egress iifname vmap @profile_of");
  EXPECT_LT(set, jump);
  EXPECT_LT(jump, vmap);
  EXPECT_LT(log, count);
  EXPECT_LT(count, drop);
  Pos(t, "add set inet sbx deny_conn_limit { type ifname; counter; }");
}

TEST(Nflog, EveryRefusalLogsBeforeItCounts) {
  std::string t = BaseRuleset(LabCfg());
  size_t log = Pos(t, "egress ip daddr 169.254.169.254/32 add @lograte { iifname limit rate 10/second burst 20 packets } log prefix \"sbx metadata\" group 1469 snaplen 64\n");
  EXPECT_LT(log, Pos(t, "egress ip daddr 169.254.169.254/32 iifname @deny_metadata"));
  Pos(t, "p_lab add @lograte { iifname limit rate 10/second burst 20 packets } log prefix \"sbx not_allowed\"");
  Pos(t, "input iifname \"sbxv*\" add @lograte { iifname limit rate 10/second burst 20 packets } log prefix \"sbx host\"");
  // As many log rules as refusals: each count rule has one.
  size_t logs = 0, counts = 0;
  for (size_t p = 0; (p = t.find(" log prefix ", p)) != std::string::npos; ++p) ++logs;
  for (size_t p = 0; (p = t.find(" iifname @deny_", p)) != std::string::npos; ++p) ++counts;
  EXPECT_EQ(logs, counts);
}

TEST(RateParams, BucketHoldsGsoPacketsAndScalesWithRate) {
  RateParams slow = RateParamsFor(1);
  EXPECT_EQ(slow.bytes_per_s, 125000u);
  EXPECT_GE(slow.burst, 2u * 65536);
  EXPECT_GE(slow.queue, 2u * 65536);
  RateParams fast = RateParamsFor(10000);
  EXPECT_EQ(fast.bytes_per_s, 1250000000u);
  EXPECT_EQ(fast.burst, 1250000000u / 50);
  EXPECT_EQ(fast.queue, 1250000000u / 20);
}

// A message as a conntrack dump answers it: nfgenmsg, then the original tuple.
std::vector<char> CtMessage(bool v6, bool with_ports) {
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  nlh->nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = v6 ? AF_INET6 : AF_INET;
  nlattr* tuple = mnl_attr_nest_start(nlh, CTA_TUPLE_ORIG);
  nlattr* ip = mnl_attr_nest_start(nlh, CTA_TUPLE_IP);
  if (v6) {
    in6_addr s{}, d{};
    inet_pton(AF_INET6, "fd00:5b::2", &s);
    inet_pton(AF_INET6, "2001:db8:1::2", &d);
    mnl_attr_put(nlh, CTA_IP_V6_SRC, 16, &s);
    mnl_attr_put(nlh, CTA_IP_V6_DST, 16, &d);
  } else {
    in_addr s{}, d{};
    inet_pton(AF_INET, "10.200.0.2", &s);
    inet_pton(AF_INET, "198.18.0.2", &d);
    mnl_attr_put(nlh, CTA_IP_V4_SRC, 4, &s);
    mnl_attr_put(nlh, CTA_IP_V4_DST, 4, &d);
  }
  mnl_attr_nest_end(nlh, ip);
  nlattr* proto = mnl_attr_nest_start(nlh, CTA_TUPLE_PROTO);
  mnl_attr_put_u8(nlh, CTA_PROTO_NUM, with_ports ? IPPROTO_TCP : IPPROTO_ICMP);
  if (with_ports) {
    mnl_attr_put_u16(nlh, CTA_PROTO_SRC_PORT, htons(40000));
    mnl_attr_put_u16(nlh, CTA_PROTO_DST_PORT, htons(8080));
  }
  mnl_attr_nest_end(nlh, proto);
  mnl_attr_nest_end(nlh, tuple);
  buf.resize(nlh->nlmsg_len);
  return buf;
}

TEST(ConntrackParse, ReadsTheOriginalTuple) {
  std::vector<char> m = CtMessage(false, true);
  std::optional<Flow> f = ParseFlowMessage(m.data(), m.size());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->ToString(), "tcp 10.200.0.2:40000 -> 198.18.0.2:8080");
  m = CtMessage(true, false);
  f = ParseFlowMessage(m.data(), m.size());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->src.AddressString(), "fd00:5b::2");
  EXPECT_EQ(f->dport, 0);
  // Truncated anywhere: refused, never read past the end.
  std::vector<char> full = CtMessage(false, true);
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<char> cut(full.begin(), full.begin() + static_cast<long>(n));
    auto* nlh = reinterpret_cast<nlmsghdr*>(cut.data());
    if (n >= sizeof(nlmsghdr)) nlh->nlmsg_len = static_cast<uint32_t>(n);
    (void)ParseFlowMessage(cut.data(), cut.size());
  }
}

}  // namespace
}  // namespace sbx::net
