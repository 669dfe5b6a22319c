#include "runtime/ns/net_counters.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace sbx::runtime::ns {
namespace {

namespace fs = std::filesystem;

// As Linux 6.x prints them (OutTransmits is new in 6.3; older kernels end at FragCreates).
constexpr std::string_view kSnmp =
    "Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams "
    "InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout "
    "ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits\n"
    "Ip: 2 64 4231710 0 0 0 0 0 4231710 3724959 0 17 0 0 0 0 0 0 0 3724959\n"
    "Icmp: InMsgs InErrors OutNoRoutes\n"
    "Icmp: 7 0 99\n";
constexpr std::string_view kSnmp6 =
    "Ip6InReceives                   \t7\n"
    "Ip6InNoRoutes                   \t40\n"
    "Ip6OutRequests                  \t28\n"
    "Ip6OutNoRoutes                  \t5\n"
    "Icmp6InMsgs                     \t0\n";

TEST(NetCounters, ParsesTheIpLinePairOnly) {
  auto v = ParseIpOutNoRoutes(kSnmp);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 17u);  // not Icmp's column of the same name
}

TEST(NetCounters, ParsesSnmp6ByName) {
  auto v = ParseIp6OutNoRoutes(kSnmp6);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 5u);  // not Ip6InNoRoutes
}

TEST(NetCounters, MalformedTextsAreErrorsNotGuesses) {
  for (std::string_view bad : {
           "",
           "Ip: Forwarding OutNoRoutes\n",                      // no value line
           "Ip: Forwarding OutNoRoutes\nIp: 2\n",               // short value line
           "Ip: Forwarding OutNoRoutes\nIcmp: 2 3\n",           // pair broken
           "Ip: Forwarding OutNoRoutes\nIp: 2 -1\n",            // not a counter
           "Ip: Forwarding OutNoRoutes\nIp: 2 99999999999999999999999\n",
           "Ip: Forwarding InDiscards\nIp: 2 3\n",              // no such column
       }) {
    EXPECT_FALSE(ParseIpOutNoRoutes(bad).ok()) << bad;
  }
  for (std::string_view bad : {"", "Ip6OutNoRoutes\n", "Ip6OutNoRoutes x\n",
                               "Ip6OutNoRoutes 1 2\n", "Ip6OutNoRoutesX 1\n"}) {
    EXPECT_FALSE(ParseIp6OutNoRoutes(bad).ok()) << bad;
  }
}

class ProcRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-net-counters-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ / "42" / "net");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& name, std::string_view text) {
    std::ofstream(root_ / "42" / "net" / name) << text;
  }
  fs::path root_;
};

TEST_F(ProcRoot, SumsBothFamilies) {
  Write("snmp", kSnmp);
  Write("snmp6", kSnmp6);
  auto v = ReadNoRouteCount(42, root_.string());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 22u);
}

TEST_F(ProcRoot, NoIpv6OnTheHostCountsIpv4Only) {
  Write("snmp", kSnmp);
  auto v = ReadNoRouteCount(42, root_.string());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 17u);
}

TEST_F(ProcRoot, AGoneProcessOrABadFileIsAnErrorNamingTheFile) {
  auto gone = ReadNoRouteCount(43, root_.string());
  EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
  EXPECT_NE(gone.status().message().find("/43/net/snmp"), std::string::npos) << gone.status();
  Write("snmp", kSnmp);
  Write("snmp6", "garbage\n");
  auto bad = ReadNoRouteCount(42, root_.string());
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/42/net/snmp6"), std::string::npos) << bad.status();
}

// This process's own namespace: whatever the counts, both files parse on this kernel.
TEST(NetCounters, ThisKernelsFilesParse) {
  auto v = ReadNoRouteCount(::getpid());
  EXPECT_TRUE(v.ok()) << v.status();
}

}  // namespace
}  // namespace sbx::runtime::ns
