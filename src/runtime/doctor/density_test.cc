#include "runtime/doctor/density.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/doctor/doctor.h"

namespace sbx::runtime::doctor {
namespace {

// This project's host: 24 GiB, 2 CPUs, hard RLIMIT_NOFILE 20000 that root cannot raise.
HostLimits ProjectHost() {
  HostLimits h;
  h.nofile_soft = h.nofile_hard = 20000;
  h.pid_max = 32768;
  h.threads_max = 192726;
  for (const char* t : {"mnt", "pid", "net", "ipc", "uts", "cgroup", "time", "user"}) {
    h.max_namespaces.emplace_back(t, 96363);
  }
  h.mem_total_mib = 24105;
  h.numa_nodes = 1;
  return h;
}

DensityInputs Inputs(int64_t max) {
  DensityInputs in;
  in.max_sandboxes = max;
  in.held_fds = DefaultHeldFds(20000);
  in.uid_ranges = 28664;
  return in;
}

const LimitRow* Row(const DensityPlan& p, const std::string& id) {
  for (const auto& r : p.rows) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

TEST(Density, ShrinkerMapsGrowAsTheSquare) {
  // 3,449 sandboxes of 12 superblocks and 3 memcgs each were 10,347 memcgs x 647 units of 1 KiB,
  // the 6.7 GiB of kmalloc-1k measured; with 8 superblocks that is 432 units.
  EXPECT_EQ(ShrinkerMapBytes(3449, 1), int64_t{3449} * 3 * 432 * 1024);
  EXPECT_EQ(ShrinkerMapBytes(3449, 1, kMemcgsPerSandboxV1), int64_t{3449} * 2 * 432 * 1024);
  EXPECT_EQ(ShrinkerMapBytes(0, 1), 0);
  EXPECT_EQ(ShrinkerMapBytes(1000, 2), 2 * ShrinkerMapBytes(1000, 1));
  EXPECT_GT(ShrinkerMapBytes(2000, 1), 3 * ShrinkerMapBytes(1000, 1));
}

TEST(Density, ProjectHostHolds5000) {
  const DensityPlan p = PlanDensity(ProjectHost(), Inputs(5000));
  EXPECT_TRUE(p.Short().empty()) << DescribeShort(p);
  // Descriptors: 20000 - 256 - (4096 + 33) = 15615 sandboxes.
  EXPECT_EQ(Row(p, "limits.open_files")->holds, 15615);
  EXPECT_EQ(Row(p, "limits.open_files")->need, 256 + 4129 + 5000);
  // pid_max: (32768 - 4096) / 2.
  EXPECT_EQ(Row(p, "limits.pids")->holds, 14336);
  EXPECT_EQ(p.host_holds, 14336);
  EXPECT_EQ(p.bottleneck, "kernel.pid_max");
  // The kernel memory of 5,000 is past a quarter of 24 GiB: a warning, not a cap.
  const LimitRow* mem = Row(p, "limits.kernel_memory");
  ASSERT_NE(mem, nullptr);
  EXPECT_FALSE(mem->hard);
  EXPECT_GT(mem->need, mem->have);
  EXPECT_LT(mem->holds, 5000);
  EXPECT_GT(mem->holds, 2000);
}

TEST(Density, ZeroMeansWhatTheHostHolds) {
  const DensityPlan p = PlanDensity(ProjectHost(), Inputs(0));
  EXPECT_EQ(p.max_sandboxes, p.host_holds);
  EXPECT_TRUE(p.Short().empty());
}

TEST(Density, LowLimitsAreShortWithTheirFixes) {
  HostLimits h = ProjectHost();
  h.nofile_soft = h.nofile_hard = 1024;  // a shell's usual limit
  h.max_namespaces[2].second = 100;       // user.max_net_namespaces
  DensityInputs in = Inputs(5000);
  in.held_fds = DefaultHeldFds(1024);
  in.pooled = 8;
  const DensityPlan p = PlanDensity(h, in);
  ASSERT_EQ(p.Short().size(), 2u);
  EXPECT_EQ(p.Short()[0]->id, "limits.open_files");
  EXPECT_EQ(p.Short()[1]->id, "limits.net_namespaces");
  // 1024 - 256 - (256 + 33) - 8 pooled.
  EXPECT_EQ(p.Short()[0]->holds, 471);
  EXPECT_EQ(p.Short()[1]->holds, 92);
  EXPECT_EQ(p.host_holds, 92);
  const std::string text = DescribeShort(p);
  EXPECT_NE(text.find("LimitNOFILE=6144"), std::string::npos) << text;
  EXPECT_NE(text.find("sysctl -w user.max_net_namespaces=5120"), std::string::npos) << text;
}

TEST(Density, WithoutUserNamespacesNoRangesCount) {
  DensityInputs in = Inputs(30000);
  in.user_namespaces = false;
  const DensityPlan p = PlanDensity(ProjectHost(), in);
  EXPECT_EQ(Row(p, "limits.uid_ranges"), nullptr);
  EXPECT_EQ(Row(p, "limits.user_namespaces"), nullptr);
  in.user_namespaces = true;
  const DensityPlan q = PlanDensity(ProjectHost(), in);
  ASSERT_NE(Row(q, "limits.uid_ranges"), nullptr);
  EXPECT_EQ(Row(q, "limits.uid_ranges")->holds, 28664);
}

TEST(Density, FakeRuntimeCountsDescriptorsOnly) {
  DensityInputs in = Inputs(100);
  in.ns = false;
  const DensityPlan p = PlanDensity(ProjectHost(), in);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].id, "limits.open_files");
}

TEST(Density, DoctorRowsReadAFakeHost) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / fmt::format("density_test_{}", ::getpid());
  fs::create_directories(root / "proc/sys/kernel");
  fs::create_directories(root / "proc/sys/user");
  fs::create_directories(root / "sys/devices/system/node/node0");
  auto put = [&](const std::string& path, const std::string& text) {
    std::ofstream(root / path) << text;
  };
  put("proc/sys/kernel/pid_max", "4096\n");
  put("proc/sys/kernel/threads-max", "100000\n");
  for (const char* t : {"mnt", "pid", "net", "ipc", "uts", "cgroup", "time", "user"}) {
    put(fmt::format("proc/sys/user/max_{}_namespaces", t), "65536\n");
  }
  put("proc/meminfo", "MemTotal:       24683620 kB\nMemFree: 1 kB\n");
  DoctorOptions o;
  o.host_root = root.string();
  o.max_sandboxes = 100;
  o.agent_path = "/nonexistent";
  Report r = RunDoctor(o);
  const Check* pids = r.Find("limits.pids");
  ASSERT_NE(pids, nullptr);
  EXPECT_EQ(pids->result, CheckResult::kWarn);  // 4096 leaves nothing beside the host's tasks
  EXPECT_NE(pids->remedy.find("sysctl -w kernel.pid_max=5120"), std::string::npos)
      << pids->remedy;
  const Check* sum = r.Find("limits.sandboxes");
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->result, CheckResult::kWarn);
  EXPECT_NE(sum->detail.find("0 (set by kernel.pid_max)"), std::string::npos) << sum->detail;
  const Check* userns = r.Find("limits.user_namespaces");
  ASSERT_NE(userns, nullptr);
  EXPECT_EQ(userns->result, CheckResult::kOk);
  fs::remove_all(root);
}

}  // namespace
}  // namespace sbx::runtime::doctor
