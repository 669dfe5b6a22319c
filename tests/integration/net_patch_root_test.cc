// A PATCH of a sandbox's egress rules, the connection limit and the bandwidth limit, with
// sbx_net in network namespaces this test makes (never the host's own network, never a packet
// off the machine): "host" (where NetworkHost runs, as sbxd would), "internet" joined to it by
// a veth (198.18.0.0/24, which the configuration exempts) and sandbox namespaces. Everything
// lives in those namespaces, which vanish with the test's fds even when it fails.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "common/unique_fd.h"
#include "net/conntrack.h"
#include "net/limits.h"
#include "net/netlink.h"
#include "net/nflog.h"
#include "net/nft.h"
#include "net/sandbox_net.h"
#include "netns_test_util.h"

namespace sbx::net {
namespace {

using namespace nstest;  // NOLINT: the namespace helpers of netns_test_util.h

UniqueFd Accept(int listener, int timeout_ms = 3000) {
  pollfd p{.fd = listener, .events = POLLIN};
  if (::poll(&p, 1, timeout_ms) != 1) return {};
  return UniqueFd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
}

// True when `msg` sent on `from` arrives on `to` within `timeout_ms`.
bool Carries(int from, int to, int timeout_ms = 1000) {
  const char msg[] = "ping";
  if (::send(from, msg, sizeof(msg), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(msg))) return false;
  pollfd p{.fd = to, .events = POLLIN};
  if (::poll(&p, 1, timeout_ms) != 1) return false;
  char in[16];
  return ::recv(to, in, sizeof(in), MSG_DONTWAIT) > 0;
}

class NetPatchRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) SBX_SKIP_OR_FAIL("needs root (network namespaces, nftables, tc)");
    original_ = CurrentNetns();
    host_ = NewNetns();
    internet_ = NewNetns();
    ASSERT_TRUE(host_ && internet_) << strerror(errno);
    ASSERT_EQ(::setns(host_.get(), CLONE_NEWNET), 0);
    in_host_ = true;
    auto nl = Netlink::Open();
    ASSERT_TRUE(nl.ok()) << nl.status();
    ASSERT_TRUE(nl->CreateVeth("up0", "inet0", internet_.get()).ok());
    int up = *nl->IfIndex("up0");
    ASSERT_TRUE(nl->AddAddress(up, IfAddr("198.18.0.1/24")).ok());
    ASSERT_TRUE(nl->SetUp(up).ok());
    ASSERT_TRUE(nl->AddDefaultRoute(up, *IpPrefix::Parse("198.18.0.2")).ok());
    auto inet = Netlink::Open(internet_.get());
    ASSERT_TRUE(inet.ok());
    int i0 = *inet->IfIndex("inet0");
    ASSERT_TRUE(inet->AddAddress(i0, IfAddr("198.18.0.2/24")).ok());
    ASSERT_TRUE(inet->SetUp(i0).ok());
    ASSERT_TRUE(inet->AddDefaultRoute(i0, *IpPrefix::Parse("198.18.0.1")).ok());
    cfg_ = {.pool4 = *IpPrefix::Parse("10.200.0.0/24"),
            .pool6 = *IpPrefix::Parse("fd00:5b::/64"),
            .exempt = {*IpPrefix::Parse("198.18.0.0/15")},
            .uplink = "up0"};
  }

  void StartHost() {
    auto host = NetworkHost::Start(cfg_);
    ASSERT_TRUE(host.ok()) << host.status();
    net_ = std::move(*host);
  }

  void TearDown() override {
    net_.reset();
    if (in_host_) {
      ASSERT_EQ(::setns(original_.get(), CLONE_NEWNET), 0);
    }
  }

  uint64_t Denied(const std::string& id, const std::string& reason) {
    auto d = net_->Denials(id);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? (*d)[reason] : 0;
  }

  UniqueFd original_, host_, internet_;
  bool in_host_ = false;
  NetPolicyConfig cfg_;
  std::unique_ptr<NetworkHost> net_;
};

std::vector<EgressRule> Rules(const char* json) { return *ParseRules(nlohmann::json::parse(json), "allow"); }

TEST_F(NetPatchRootTest, PatchCutsTheFlowsItForbidsAndKeepsTheRest) {
  StartHost();
  UniqueFd l80 = Listen(internet_.get(), "0.0.0.0", 80), l8080 = Listen(internet_.get(), "0.0.0.0", 8080);
  UniqueFd ns = NewNetns();
  auto sb = net_->Attach("sbx_patch", ns.get(), {.profile = "open"});
  ASSERT_TRUE(sb.ok()) << sb.status();
  UniqueFd doomed = Connect(ns.get(), "198.18.0.2", 8080), kept = Connect(ns.get(), "198.18.0.2", 80);
  ASSERT_TRUE(doomed && kept);
  UniqueFd doomed_srv = Accept(l8080.get()), kept_srv = Accept(l80.get());
  ASSERT_TRUE(doomed_srv && kept_srv);
  ASSERT_TRUE(Carries(doomed.get(), doomed_srv.get()));
  ASSERT_TRUE(Carries(doomed_srv.get(), doomed.get()));

  auto cut = net_->PatchAllow("sbx_patch", "open", Rules(R"([{"cidr":"198.18.0.2/32","ports":"80","protocol":"tcp"}])"));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(*cut, 1);
  // The resolver and the proxy read the new rules from here.
  auto rules = net_->RulesOf("sbx_patch");
  ASSERT_TRUE(rules.has_value());
  ASSERT_EQ(rules->allow.size(), 1u);
  EXPECT_EQ(rules->allow[0].port_lo, 80);
  // Neither way any more: the sandbox's packets meet its new chain, the remote side's find no
  // connection (the host answers them with a reset, having no socket for them).
  EXPECT_FALSE(Carries(doomed.get(), doomed_srv.get()));
  EXPECT_FALSE(Carries(doomed_srv.get(), doomed.get()));
  EXPECT_TRUE(Carries(kept.get(), kept_srv.get()));
  EXPECT_TRUE(Carries(kept_srv.get(), kept.get()));
  EXPECT_FALSE(Connect(ns.get(), "198.18.0.2", 8080, 500));
  EXPECT_GT(Denied("sbx_patch", "not_allowed"), 0u);

  // Again (idempotent: nothing left to cut), then wider again within the profile.
  cut = net_->PatchAllow("sbx_patch", "open", Rules(R"([{"cidr":"198.18.0.2/32","ports":"80","protocol":"tcp"}])"));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(*cut, 0);
  EXPECT_TRUE(Carries(kept.get(), kept_srv.get()));
  cut = net_->PatchAllow("sbx_patch", "open", Rules(R"([{"cidr":"198.18.0.0/24"}])"));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_TRUE(Connect(ns.get(), "198.18.0.2", 8080));
  EXPECT_TRUE(absl::IsNotFound(net_->PatchAllow("sbx_nobody", "open", {}).status()));

  // The chain the first PATCH made goes with the sandbox.
  ASSERT_TRUE((*sb)->Destroy().ok());
  auto nft = Nft::Open();
  ASSERT_TRUE(nft.ok());
  auto chains = (*nft)->SandboxChains();
  ASSERT_TRUE(chains.ok()) << chains.status();
  EXPECT_EQ(chains->count("sbx_patch"), 0u);
}

TEST_F(NetPatchRootTest, ConntrackDeleteCutsALiveFlow) {
  StartHost();
  UniqueFd l = Listen(internet_.get(), "0.0.0.0", 8080);
  UniqueFd ns = NewNetns();
  auto sb = net_->Attach("sbx_ct", ns.get(), {.profile = "open"});
  ASSERT_TRUE(sb.ok()) << sb.status();
  UniqueFd c = Connect(ns.get(), "198.18.0.2", 8080);
  ASSERT_TRUE(c);
  UniqueFd s = Accept(l.get());
  ASSERT_TRUE(s);
  ASSERT_TRUE(Carries(s.get(), c.get()));
  auto ct = Conntrack::Open();
  ASSERT_TRUE(ct.ok()) << ct.status();
  auto flows = ct->FlowsFrom({(*sb)->addrs().sandbox4});
  ASSERT_TRUE(flows.ok()) << flows.status();
  ASSERT_EQ(flows->size(), 1u);
  EXPECT_EQ((*flows)[0].dport, 8080);
  EXPECT_EQ((*flows)[0].dst.AddressString(), "198.18.0.2");
  ASSERT_TRUE(ct->Delete((*flows)[0]).ok());
  EXPECT_TRUE(absl::IsNotFound(ct->Delete((*flows)[0])));
  // The remote side's next segment finds no connection: the host resets it.
  EXPECT_FALSE(Carries(s.get(), c.get()));
  pollfd p{.fd = s.get(), .events = POLLIN};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  char buf[8];
  EXPECT_EQ(::recv(s.get(), buf, sizeof(buf), MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, ECONNRESET);
}

TEST_F(NetPatchRootTest, ConnectionLimitRefusesTheNextOne) {
  cfg_.max_connections = 3;
  StartHost();
  UniqueFd l = Listen(internet_.get(), "0.0.0.0", 8080);
  UniqueFd ns = NewNetns(), other_ns = NewNetns();
  auto sb = net_->Attach("sbx_conns", ns.get(), {.profile = "open"});
  ASSERT_TRUE(sb.ok()) << sb.status();
  auto other = net_->Attach("sbx_other", other_ns.get(), {.profile = "open"});
  ASSERT_TRUE(other.ok()) << other.status();
  std::vector<UniqueFd> open;
  for (int i = 0; i < 3; ++i) {
    open.push_back(Connect(ns.get(), "198.18.0.2", 8080));
    ASSERT_TRUE(open.back()) << i;
  }
  EXPECT_FALSE(Connect(ns.get(), "198.18.0.2", 8080, 500));
  EXPECT_GT(Denied("sbx_conns", "conn_limit"), 0u);
  EXPECT_TRUE(Connect(other_ns.get(), "198.18.0.2", 8080));  // per sandbox, not shared
  EXPECT_TRUE(Carries(open[0].get(), Accept(l.get()).get()));  // the open ones still work
}

TEST_F(NetPatchRootTest, RateLimitQdiscsComeAndGoWithTheVeth) {
  cfg_.rate_mbit = 8;
  StartHost();
  UniqueFd ns = NewNetns();
  auto sb = net_->Attach("sbx_rate", ns.get(), {.profile = "open"});
  ASSERT_TRUE(sb.ok()) << sb.status();
  auto nl = Netlink::Open();
  ASSERT_TRUE(nl.ok());
  int idx = *nl->IfIndex((*sb)->veth());
  auto tc = TrafficControl::Open();
  ASSERT_TRUE(tc.ok()) << tc.status();
  auto kinds = tc->QdiscKinds(idx);
  ASSERT_TRUE(kinds.ok()) << kinds.status();
  EXPECT_NE(std::find(kinds->begin(), kinds->end(), "tbf"), kinds->end());
  // The sandbox's end too, where its root cannot touch it.
  auto inside = TrafficControl::Open(ns.get());
  ASSERT_TRUE(inside.ok()) << inside.status();
  auto in_nl = Netlink::Open(ns.get());
  ASSERT_TRUE(in_nl.ok());
  auto in_kinds = inside->QdiscKinds(*in_nl->IfIndex("eth0"));
  ASSERT_TRUE(in_kinds.ok()) << in_kinds.status();
  EXPECT_NE(std::find(in_kinds->begin(), in_kinds->end(), "tbf"), in_kinds->end());
  ASSERT_TRUE(tc->LimitRate(idx, 16).ok());  // a second limit replaces the first
  ASSERT_TRUE((*sb)->Destroy().ok());
  kinds = tc->QdiscKinds(idx);
  ASSERT_TRUE(kinds.ok()) << kinds.status();
  EXPECT_TRUE(kinds->empty());
}

TEST_F(NetPatchRootTest, RefusalsAreLoggedAsRecentDenialsOfTheirSandbox) {
  StartHost();
  ASSERT_TRUE(net_->StartDenialReader().ok());
  UniqueFd ns = NewNetns();
  std::vector<EgressRule> narrow = Rules(R"([{"cidr":"198.18.0.2/32","ports":"80","protocol":"tcp"}])");
  auto sb = net_->Attach("sbx_log", ns.get(), {.profile = "open", .narrowed = narrow});
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_FALSE(Connect(ns.get(), "198.18.0.2", 8443, 300));
  EXPECT_FALSE(Connect(ns.get(), "169.254.169.254", 80, 300));
  auto has = [&](const std::string& reason, const std::string& dst, uint16_t port) {
    for (const auto& d : net_->denials_log().Recent("sbx_log")) {
      if (d.reason == reason && d.dest == dst && d.port == port && d.protocol == "tcp") return true;
    }
    return false;
  };
  for (int i = 0; i < 50 && !(has("not_allowed", "198.18.0.2", 8443) && has("metadata", "169.254.169.254", 80)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(has("not_allowed", "198.18.0.2", 8443));
  EXPECT_TRUE(has("metadata", "169.254.169.254", 80));
  // Counted by nft, not again by the log.
  EXPECT_TRUE(net_->denials_log().Counts("sbx_log").empty());
  EXPECT_GT(Denied("sbx_log", "not_allowed"), 0u);
}

}  // namespace
}  // namespace sbx::net
