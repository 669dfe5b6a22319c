#include "daemon/host_capacity.h"

#include <gtest/gtest.h>

namespace sbx::daemon {
namespace {

TEST(HostCapacity, MemTotalIsParsed) {
  EXPECT_EQ(ParseMemTotalKib("MemTotal:       24552344 kB\nMemFree:  1 kB\n"), 24552344);
  EXPECT_EQ(ParseMemTotalKib("MemFree: 1 kB\nMemTotal: 2048 kB\n"), 2048);
  EXPECT_FALSE(ParseMemTotalKib("MemFree: 1 kB\n").has_value());
  EXPECT_FALSE(ParseMemTotalKib("XMemTotal: 5 kB\n").has_value());
  EXPECT_FALSE(ParseMemTotalKib("MemTotal: lots\n").has_value());
}

TEST(HostCapacity, CgroupLimitsLowerTheHostAndAllocatedDisksAreAddedToFreeSpace) {
  service::HostCapacity c = CombineHostCapacity(8, 16 << 20, int64_t{10} << 30, {});
  EXPECT_EQ(c.vcpu, 8);
  EXPECT_EQ(c.memory_mib, 16 << 10);
  EXPECT_EQ(c.disk_mib, 10 << 10);
  c = CombineHostCapacity(8, 16 << 20, int64_t{10} << 30,
                          {runtime::HostShare{2500, 4096, 300}, runtime::HostShare{0, 0, 200}});
  EXPECT_EQ(c.vcpu, 2);
  EXPECT_EQ(c.memory_mib, 4096);
  EXPECT_EQ(c.disk_mib, (10 << 10) + 500);
  // A quota below one CPU still lets one vCPU be promised; a limit above the host is moot.
  c = CombineHostCapacity(8, 16 << 20, 0, {runtime::HostShare{500, 1 << 30, 0}});
  EXPECT_EQ(c.vcpu, 1);
  EXPECT_EQ(c.memory_mib, 16 << 10);
}

TEST(HostCapacity, ThisHostCanBeProbed) {
  auto c = ProbeHostCapacity("/tmp", {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->vcpu, 0);
  EXPECT_GT(c->memory_mib, 0);
  auto missing = ProbeHostCapacity("/nonexistent-sbx-state-dir", {});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("statvfs"), std::string::npos);
}

}  // namespace
}  // namespace sbx::daemon
