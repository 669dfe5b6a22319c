// Pooled sandbox networks (issue 16's speed): NetworkHost::Prebuild, Claim and the networked
// kind of NetnsPool, in network namespaces this test makes (never the host's own network,
// never a packet off the machine): "host" (where NetworkHost runs, as sbxd would) and
// "internet", joined by a veth, with a stand-in server on 198.18.0.2 (exempted 198.18.0.0/15).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "common/unique_fd.h"
#include "net/netlink.h"
#include "net/sandbox_net.h"
#include "netns_test_util.h"
#include "runtime/ns/netns_pool.h"

namespace sbx::net {
namespace {

using namespace nstest;  // NOLINT: the namespace helpers of netns_test_util.h

// The alias of host link `name`, "" when there is no such link.
std::string AliasOf(const std::string& name) {
  auto nl = Netlink::Open();
  if (!nl.ok()) return "";
  auto links = nl->ListLinks();
  if (!links.ok()) return "";
  for (const auto& l : *links) {
    if (l.name == name) return l.alias.empty() ? "(none)" : l.alias;
  }
  return "";
}

class NetPoolRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) SBX_SKIP_OR_FAIL("needs root (network namespaces, nftables)");
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
    IpPrefix host_addr = *IpPrefix::Parse("198.18.0.1");
    host_addr.len = 24;
    ASSERT_TRUE(nl->AddAddress(up, host_addr).ok());
    ASSERT_TRUE(nl->SetUp(up).ok());
    ASSERT_TRUE(nl->AddDefaultRoute(up, *IpPrefix::Parse("198.18.0.2")).ok());
    auto inet = Netlink::Open(internet_.get());
    ASSERT_TRUE(inet.ok());
    int i0 = *inet->IfIndex("inet0");
    IpPrefix inet_addr = *IpPrefix::Parse("198.18.0.2");
    inet_addr.len = 24;
    ASSERT_TRUE(inet->AddAddress(i0, inet_addr).ok());
    ASSERT_TRUE(inet->SetUp(i0).ok());
    ASSERT_TRUE(inet->AddDefaultRoute(i0, *IpPrefix::Parse("198.18.0.1")).ok());
    listeners_.push_back(Listen(internet_.get(), "0.0.0.0", 80));
    listeners_.push_back(Listen(internet_.get(), "0.0.0.0", 8080));
    listeners_.push_back(Listen(host_.get(), "0.0.0.0", 7777));  // sbxd's API
    cfg_ = {.pool4 = *IpPrefix::Parse("10.200.0.0/24"),
            .pool6 = *IpPrefix::Parse("fd00:5b::/64"),
            .exempt = {*IpPrefix::Parse("198.18.0.0/15")},
            .uplink = "up0"};
    auto lab = ParseProfile("lab", nlohmann::json::parse(
        R"({"allow":[{"cidr":"198.18.0.2","ports":"80","protocol":"tcp"}]})"));
    ASSERT_TRUE(lab.ok()) << lab.status();
    cfg_.profiles.push_back(*lab);
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

  UniqueFd original_, host_, internet_;
  bool in_host_ = false;
  std::vector<UniqueFd> listeners_;
  NetPolicyConfig cfg_;
  std::unique_ptr<NetworkHost> net_;
};

TEST_F(NetPoolRootTest, PooledVethPassesNoTrafficUntilClaimed) {
  UniqueFd ns = NewNetns();
  auto pooled = net_->Prebuild(ns.get());
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  SandboxNetwork& net = **pooled;
  EXPECT_EQ(net.id(), "");
  EXPECT_EQ(AliasOf(net.veth()), PooledAlias(net.veth()));
  EXPECT_EQ(net_->pool().in_use(), 1u);
  // Addresses, routes and links are there, but no element: the allowed destination, the host
  // and the gateway are all unreachable.
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.2", 80, "", 500));
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.1", 7777, "", 500));
  EXPECT_FALSE(TcpReaches(ns.get(), net.addrs().host4.AddressString(), 7777, "", 500));
  EXPECT_FALSE(net_->Denials("").ok());

  ASSERT_TRUE(net_->Claim(net, "sbx_claimed", {.profile = "lab"}).ok());
  EXPECT_EQ(net.id(), "sbx_claimed");
  EXPECT_EQ(AliasOf(net.veth()), "sbx_claimed");
  // Exactly its rules now: the first SYN goes through (the link was operational before).
  EXPECT_TRUE(TcpReaches(ns.get(), "198.18.0.2", 80));
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.2", 8080, "", 500));
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.1", 7777, "", 500));
  auto denied = net_->Denials("sbx_claimed");
  ASSERT_TRUE(denied.ok()) << denied.status();
  EXPECT_GT((*denied)["not_allowed"], 0u);
  EXPECT_GT((*denied)["host"], 0u);

  // A claimed network is no longer claimable.
  EXPECT_EQ(net_->Claim(net, "sbx_again", {.profile = "lab"}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(net.Destroy().ok());
  EXPECT_EQ(AliasOf(net.veth()), "");
  EXPECT_EQ(net_->pool().in_use(), 0u);
}

// A network-ready warm-pool member runs its agent on an unclaimed veth (docs/isolation.md
// §2.5): with sbxd's resolver and proxy on, the veth still reaches nothing, not even the
// resolver, whose redirect would otherwise take it into the host; once claimed, DNS does.
TEST_F(NetPoolRootTest, UnclaimedVethReachesNotEvenTheResolver) {
  net_.reset();
  cfg_.dns_port = 10053;
  cfg_.proxy_port = 10080;
  auto host = NetworkHost::Start(cfg_);
  ASSERT_TRUE(host.ok()) << host.status();
  net_ = std::move(*host);
  // Stand-ins for sbxd's resolver (TCP: a completed handshake shows the input chain let it in)
  // and proxy, on every host address.
  listeners_.push_back(Listen(host_.get(), "0.0.0.0", 10053));
  listeners_.push_back(Listen(host_.get(), "0.0.0.0", 10080));
  UniqueFd ns = NewNetns();
  auto pooled = net_->Prebuild(ns.get());
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  SandboxNetwork& net = **pooled;
  const std::string gw = net.addrs().host4.AddressString();
  EXPECT_FALSE(TcpReaches(ns.get(), gw, 53, "", 500));     // the resolver, redirected
  EXPECT_FALSE(TcpReaches(ns.get(), gw, 10053, "", 500));  // the resolver, directly
  EXPECT_FALSE(TcpReaches(ns.get(), gw, 10080, "", 500));  // the proxy
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.1", 53, "", 500));
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.2", 80, "", 500));
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.2", 53, "", 500));
  // A claimed network reaches the resolver (its own address), and its profile.
  ASSERT_TRUE(net_->Claim(net, "sbx_dns", {.profile = "lab"}).ok());
  EXPECT_TRUE(TcpReaches(ns.get(), gw, 53));
  EXPECT_TRUE(TcpReaches(ns.get(), "198.18.0.2", 80));
  EXPECT_FALSE(TcpReaches(ns.get(), gw, 10053, "", 500));
  // ... but not with a source that is not its own.
  EXPECT_FALSE(TcpReaches(ns.get(), gw, 53, "10.200.0.99", 500));
  ASSERT_TRUE(net.Destroy().ok());
  EXPECT_EQ(net_->pool().in_use(), 0u);
}

TEST_F(NetPoolRootTest, ClaimRefusesBadInputAndDestroyLeavesNothing) {
  UniqueFd ns = NewNetns();
  auto pooled = net_->Prebuild(ns.get());
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  const std::string veth = (*pooled)->veth();
  EXPECT_EQ(net_->Claim(**pooled, "sbx_x", {.profile = "nope"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(net_->Claim(**pooled, "x\"; flush ruleset", {.profile = "open"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*pooled)->id(), "");  // still unclaimed, still passes nothing
  EXPECT_FALSE(TcpReaches(ns.get(), "198.18.0.2", 80, "", 500));
  pooled->reset();  // an unclaimed pooled network destroyed (the pool stops)
  EXPECT_EQ(AliasOf(veth), "");
  EXPECT_EQ(net_->pool().in_use(), 0u);
}

TEST_F(NetPoolRootTest, SweepKeepsLivePooledVethsAndRemovesLeftovers) {
  UniqueFd ns1 = NewNetns(), ns2 = NewNetns();
  auto live = net_->Prebuild(ns1.get());
  ASSERT_TRUE(live.ok()) << live.status();
  auto left = net_->Prebuild(ns2.get());
  ASSERT_TRUE(left.ok()) << left.status();
  const std::string live_veth = (*live)->veth(), left_veth = (*left)->veth();
  // This sbxd's own pool is not swept (its filler may run before the start-up sweep).
  ASSERT_TRUE(net_->Sweep({}).ok());
  EXPECT_EQ(AliasOf(live_veth), PooledAlias(live_veth));
  EXPECT_EQ(AliasOf(left_veth), PooledAlias(left_veth));
  // sbxd died with `left` pooled: the next sbxd's sweep removes it, whatever ids it knows.
  (*left)->Release();
  auto restarted = NetworkHost::Start(cfg_);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE((*restarted)->Sweep({"sbx_known", "sbx_other"}).ok());
  EXPECT_EQ(AliasOf(left_veth), "");
  EXPECT_EQ(AliasOf(live_veth), "");  // unknown to the restarted host as well
  EXPECT_TRUE((*live)->Destroy().ok());  // idempotent: the link is already gone
}

TEST_F(NetPoolRootTest, NetnsPoolServesNetworkedNamespaces) {
  runtime::ns::NetnsPool pool(1, net_.get());
  pool.Start();
  EXPECT_FALSE(pool.TakeNetworked().has_value());  // the first call starts its filler
  for (int i = 0; i < 200 && pool.ready_networked() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(pool.ready_networked(), 1);
  std::optional<runtime::ns::PooledNetns> got = pool.TakeNetworked();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->netns && got->network);
  EXPECT_EQ(got->network->id(), "");
  EXPECT_FALSE(TcpReaches(got->netns.get(), "198.18.0.2", 80, "", 500));
  ASSERT_TRUE(net_->Claim(*got->network, "sbx_from_pool", {.profile = "open"}).ok());
  EXPECT_TRUE(TcpReaches(got->netns.get(), "198.18.0.2", 8080));
  EXPECT_EQ(AliasOf(got->network->veth()), "sbx_from_pool");
  // The filler refills; the pool's destructor removes what it still holds.
  for (int i = 0; i < 200 && pool.ready_networked() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(pool.ready_networked(), 1);
}

// What the create path costs with and without the pool: Attach (slot, elements, veth, addresses,
// routes, wait) against Claim of a prebuilt one (elements and alias). Printed, never asserted
// (the machine may be loaded): CPU of this thread, the kernel's netlink work included, and wall.
TEST_F(NetPoolRootTest, ClaimCostsTheCreatePathLessThanAttach) {
  constexpr int kCount = 30;
  auto now = [](clockid_t c) {
    timespec t{};
    ::clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<UniqueFd> nss;
  std::vector<std::unique_ptr<SandboxNetwork>> nets;
  std::vector<double> attach_cpu, attach_wall, claim_cpu, claim_wall;
  for (int i = 0; i < kCount; ++i) {
    nss.push_back(NewNetns());
    double w = now(CLOCK_MONOTONIC), c = now(CLOCK_THREAD_CPUTIME_ID);
    auto sb = net_->Attach("sbx_attach" + std::to_string(i), nss.back().get(), {.profile = "lab"});
    attach_cpu.push_back(now(CLOCK_THREAD_CPUTIME_ID) - c);
    attach_wall.push_back(now(CLOCK_MONOTONIC) - w);
    ASSERT_TRUE(sb.ok()) << sb.status();
    nets.push_back(std::move(*sb));
    nss.push_back(NewNetns());
    auto pooled = net_->Prebuild(nss.back().get());
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    w = now(CLOCK_MONOTONIC);
    c = now(CLOCK_THREAD_CPUTIME_ID);
    absl::Status st = net_->Claim(**pooled, "sbx_claim" + std::to_string(i), {.profile = "lab"});
    claim_cpu.push_back(now(CLOCK_THREAD_CPUTIME_ID) - c);
    claim_wall.push_back(now(CLOCK_MONOTONIC) - w);
    ASSERT_TRUE(st.ok()) << st;
    nets.push_back(std::move(*pooled));
  }
  EXPECT_TRUE(TcpReaches(nss.back().get(), "198.18.0.2", 80));
  std::printf("create path, median of %d: Attach CPU %.2f ms wall %.2f ms; Claim of a pooled "
              "network CPU %.2f ms wall %.2f ms\n", kCount, median(attach_cpu), median(attach_wall),
              median(claim_cpu), median(claim_wall));
}

}  // namespace
}  // namespace sbx::net
