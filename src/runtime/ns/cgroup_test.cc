// Cgroup layout detection and path building against fake /proc + cgroupfs trees (no root).
#include "runtime/ns/cgroup.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/ids.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

// This machine: hybrid, cpu and cpuacct mounted separately, memory nested under a machine
// agent's cgroup, an empty v2 hierarchy at /sys/fs/cgroup/unified.
constexpr char kHybridMounts[] =
    "/dev/vda / ext4 rw,relatime 0 0\n"
    "proc /proc proc rw,relatime 0 0\n"
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    "cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n"
    "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0\n"
    "cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0\n"
    "cgroup /sys/fs/cgroup/blkio cgroup rw,relatime,blkio 0 0\n"
    "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
    "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
constexpr char kHybridSelf[] =
    "9:name=systemd:/\n"
    "8:pids:/\n"
    "7:blkio:/\n"
    "6:freezer:/\n"
    "5:devices:/\n"
    "4:memory:/process_api/b393e8e0\n"
    "3:cpuset:/\n"
    "2:cpuacct:/\n"
    "1:cpu:/\n"
    "0::/\n";

class FakeHost {
 public:
  FakeHost() {
    char tmpl[] = "/tmp/sbx-cgroup-test-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    EXPECT_NE(d, nullptr);
    root_ = d;
  }
  ~FakeHost() { EXPECT_TRUE(RemoveTree(root_).ok()); }

  void Write(const std::string& rel, const std::string& content) {
    std::string path = root_ + "/" + rel;
    ASSERT_TRUE(MkdirAll(path.substr(0, path.rfind('/')), 0755).ok());
    ASSERT_TRUE(WriteStringToFile(path, content, /*create=*/true).ok());
  }
  void Mkdir(const std::string& rel) { ASSERT_TRUE(MkdirAll(root_ + "/" + rel, 0755).ok()); }
  std::string Read(const std::string& rel) {
    auto s = ReadFileToString(root_ + "/" + rel);
    return s.ok() ? *s : "<" + std::string(s.status().message()) + ">";
  }
  bool Exists(const std::string& rel) {
    struct stat st;
    return ::stat((root_ + "/" + rel).c_str(), &st) == 0;
  }
  std::string cg(const std::string& rel = "") const {
    return rel.empty() ? root_ + "/cg" : root_ + "/cg/" + rel;
  }
  CgroupEnv env() const { return CgroupEnv{root_ + "/proc", root_ + "/cg", true}; }

 private:
  std::string root_;
};

CgroupLimits Limits() {
  CgroupLimits l;
  l.memory_bytes = 256 << 20;
  l.pids = 64;
  l.cpu_quota_us = 200000;
  l.cpu_period_us = 100000;
  return l;
}

std::map<std::string, std::string> ByKey(const std::vector<SandboxCgroup::Dir>& dirs) {
  std::map<std::string, std::string> out;
  for (const auto& d : dirs) out[d.key] = d.path;
  return out;
}

TEST(CgroupDetect, HybridLikeThisMachine) {
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  auto layout = DetectCgroupLayout(h.env());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->pure_v2());
  ASSERT_EQ(layout->v1.count("memory"), 1u);
  EXPECT_EQ(layout->v1.at("memory").mount, h.cg("memory"));
  EXPECT_EQ(layout->v1.at("memory").own, "/process_api/b393e8e0");
  EXPECT_EQ(layout->v1.at("cpu").mount, h.cg("cpu"));
  EXPECT_EQ(layout->v1.at("pids").own, "/");
  EXPECT_TRUE(layout->has_v2);
  EXPECT_EQ(layout->v2_mount, h.cg("unified"));
  EXPECT_EQ(layout->v2_own, "/");

  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_EQ((*driver)->Name(), "cgroup-v1+v2-hybrid");
  EXPECT_TRUE((*driver)->UseCloneIntoCgroup());
  const std::string id = NewId("sbx");
  auto dirs = ByKey((*driver)->SandboxDirs(id));
  EXPECT_EQ(dirs.size(), 4u);
  EXPECT_EQ(dirs["memory"], h.cg("memory/process_api/b393e8e0/sbx/" + id));
  EXPECT_EQ(dirs["pids"], h.cg("pids/sbx/" + id));
  EXPECT_EQ(dirs["cpu"], h.cg("cpu/sbx/" + id));
  EXPECT_EQ(dirs["unified"], h.cg("unified/sbx/" + id));

  ASSERT_TRUE((*driver)->Setup().ok());
  EXPECT_TRUE(h.Exists("cg/memory/process_api/b393e8e0/sbx"));
  EXPECT_TRUE(h.Exists("cg/unified/sbx"));
  auto cg = (*driver)->Create(id, Limits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ(h.Read("cg/memory/process_api/b393e8e0/sbx/" + id + "/memory.limit_in_bytes"),
            std::to_string(256 << 20));
  EXPECT_EQ(h.Read("cg/pids/sbx/" + id + "/pids.max"), "64");
  EXPECT_EQ(h.Read("cg/cpu/sbx/" + id + "/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(h.Read("cg/cpu/sbx/" + id + "/cpu.cfs_quota_us"), "200000");
  EXPECT_EQ((*cg)->v2_path(), h.cg("unified/sbx/" + id));
  // The v2 directory of a hybrid host has no memory controller: OOM kills count in v1.
  EXPECT_EQ((*cg)->OomCounterPath(),
            h.cg("memory/process_api/b393e8e0/sbx/" + id + "/memory.oom_control"));
  auto json = (*cg)->ToJson();
  EXPECT_EQ(json["memory"], dirs["memory"]);
  (*cg)->Release();  // fake dirs hold plain files; rmdir would fail

  // A second create of the same id is refused rather than sharing a leftover.
  auto again = (*driver)->Create(id, Limits());
  EXPECT_FALSE(again.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
}

CgroupLimits SplitLimits() {
  CgroupLimits l = Limits();
  l.agent_memory_bytes = 32 << 20;
  l.agent_pids = 16;
  return l;
}

// v1 / hybrid: the agent sits in the sandbox's directory, whose limits are the workload's plus
// its own; only the workload gets a child. Two memory cgroups per sandbox, not three.
TEST(CgroupSplit, HybridPutsTheAgentInTheSandboxDirectory) {
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->Setup().ok());
  const std::string id = NewId("sbx");
  auto cg = (*driver)->Create(id, SplitLimits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ((*cg)->agent_leaf(), "");
  const std::string mem = "cg/memory/process_api/b393e8e0/sbx/" + id;
  for (const std::string& dir : {mem, "cg/pids/sbx/" + id, "cg/cpu/sbx/" + id, "cg/unified/sbx/" + id}) {
    EXPECT_TRUE(h.Exists(dir + "/work")) << dir;
    EXPECT_FALSE(h.Exists(dir + "/agent")) << dir;
  }
  EXPECT_EQ(h.Read(mem + "/work/memory.limit_in_bytes"), std::to_string(256 << 20));
  EXPECT_EQ(h.Read(mem + "/memory.limit_in_bytes"), std::to_string((256 + 32) << 20));
  EXPECT_EQ(h.Read("cg/pids/sbx/" + id + "/work/pids.max"), "64");
  EXPECT_EQ(h.Read("cg/pids/sbx/" + id + "/pids.max"), "80");
  EXPECT_EQ(h.Read("cg/cpu/sbx/" + id + "/cpu.cfs_quota_us"), "200000");
  EXPECT_EQ(h.Read("cg/cpu/sbx/" + id + "/work/cpu.shares"), std::to_string(kWorkCpuShares));
  EXPECT_TRUE((*cg)->Split());
  EXPECT_EQ((*cg)->OomCounterPath(), h.cg(mem.substr(3) + "/work/memory.oom_control"));
  // The agent's kills count in the sandbox's own directory (v1 counts no child's).
  EXPECT_EQ((*cg)->AgentOomCounterPath(), h.cg(mem.substr(3) + "/memory.oom_control"));
  // The agent joins the directories themselves; its children join work/.
  for (const std::string& dir : {mem, "cg/pids/sbx/" + id, "cg/cpu/sbx/" + id}) h.Write(dir + "/cgroup.procs", "");
  auto agent_fds = (*cg)->OpenProcsFiles(/*skip_v2=*/true, (*cg)->agent_leaf());
  ASSERT_TRUE(agent_fds.ok()) << agent_fds.status();
  EXPECT_EQ(agent_fds->size(), 3u);
  (*cg)->Release();

  // A sandbox made before the move still has agent/ children: its agent's counter is there.
  const std::string old_id = NewId("sbx");
  h.Mkdir("cg/memory/process_api/b393e8e0/sbx/" + old_id + "/agent");
  h.Mkdir("cg/memory/process_api/b393e8e0/sbx/" + old_id + "/work");
  auto old = (*driver)->Existing(old_id);
  EXPECT_TRUE(old->Split());
  EXPECT_EQ(old->AgentOomCounterPath(),
            h.cg("memory/process_api/b393e8e0/sbx/" + old_id + "/agent/memory.oom_control"));
}

// A pure v2 host whose sbxd runs in /svc with every controller delegated, and its driver
// after Setup.
absl::StatusOr<std::unique_ptr<CgroupDriver>> PureV2Driver(FakeHost& h) {
  h.Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n");
  h.Write("proc/self/cgroup", "0::/svc\n");
  h.Write("cg/svc/cgroup.controllers", "cpu memory pids\n");
  h.Write("cg/svc/cgroup.subtree_control", "\n");
  h.Write("cg/svc/cgroup.procs", "\n");
  auto driver = MakeCgroupDriver(h.env());
  if (driver.ok()) {
    if (absl::Status st = (*driver)->Setup(); !st.ok()) return st;
  }
  return driver;
}

template <typename F>
bool WaitUntil(F pred) {
  for (int i = 0; i < 10000 && !pred(); ++i) ::usleep(1000);
  return pred();
}

// Pre-built sets (cgroup_pool.h): a split create renames one to the sandbox's id in every v1
// hierarchy, the v2 directory is still made, and the limits are written as for a new one.
TEST(CgroupPool, HybridCreateRenamesAPooledSetAndWritesItsLimits) {
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  const std::string mem = "cg/memory/process_api/b393e8e0/sbx/";
  const std::vector<std::string> v1_parents = {mem, "cg/pids/sbx/", "cg/cpu/sbx/"};
  std::string id;
  {
    auto driver = MakeCgroupDriver(h.env());
    ASSERT_TRUE(driver.ok()) << driver.status();
    ASSERT_TRUE((*driver)->Setup().ok());
    auto pooled = (*driver)->StartPool(2, "t1");
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    EXPECT_EQ(*pooled, 3);  // memory, pids, cpu; not the unified hierarchy
    // Two whole sets (the filler makes a set's directories one after another).
    ASSERT_TRUE(WaitUntil([&] {
      bool all = true;
      for (const std::string& p : v1_parents) {
        all = all && h.Exists(p + "pool-t1-0/work") && h.Exists(p + "pool-t1-1/work");
      }
      return all;
    }));
    EXPECT_FALSE(h.Exists("cg/unified/sbx/pool-t1-0"));

    id = NewId("sbx");
    auto cg = (*driver)->Create(id, SplitLimits());
    ASSERT_TRUE(cg.ok()) << cg.status();
    for (const std::string& p : v1_parents) {
      EXPECT_FALSE(h.Exists(p + "pool-t1-0")) << p;  // renamed, first in first out
      EXPECT_TRUE(h.Exists(p + id + "/work")) << p;
    }
    EXPECT_TRUE(h.Exists("cg/unified/sbx/" + id + "/work"));
    EXPECT_EQ(h.Read(mem + id + "/work/memory.limit_in_bytes"), std::to_string(256 << 20));
    EXPECT_EQ(h.Read(mem + id + "/memory.limit_in_bytes"), std::to_string((256 + 32) << 20));
    EXPECT_EQ(h.Read("cg/pids/sbx/" + id + "/pids.max"), "80");
    EXPECT_EQ(h.Read("cg/cpu/sbx/" + id + "/work/cpu.shares"), std::to_string(kWorkCpuShares));
    for (const auto& d : (*cg)->dirs()) EXPECT_TRUE(d.created) << d.key;  // Destroy removes them
    (*cg)->Release();

    // A sandbox without the split makes its own directories: a pooled set has a work child.
    const std::string plain = NewId("sbx");
    auto cg2 = (*driver)->Create(plain, Limits());
    ASSERT_TRUE(cg2.ok()) << cg2.status();
    EXPECT_FALSE(h.Exists("cg/pids/sbx/" + plain + "/work"));
    EXPECT_TRUE(h.Exists("cg/pids/sbx/pool-t1-1"));
    (*cg2)->Release();

    // An id that exists already fails as a mkdir would, and takes the set down with it.
    auto again = (*driver)->Create(id, SplitLimits());
    EXPECT_FALSE(again.ok());
  }
  // The pool went with its driver, and with it every set it held; the sandbox's stay.
  for (const std::string& p : v1_parents) {
    auto names = ListDir(h.cg(p.substr(3)));
    ASSERT_TRUE(names.ok()) << names.status();
    for (const std::string& n : *names) EXPECT_NE(n.rfind("pool-", 0), 0u) << p << n;
    EXPECT_TRUE(h.Exists(p + id + "/work")) << p;
  }
}

// What an earlier run of this sbxd left is removed at start; another sbxd's sets (another tag)
// and sandbox directories are not.
TEST(CgroupPool, StartRemovesOnlyThisTagsLeftovers) {
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->Setup().ok());
  const std::string sandbox = NewId("sbx");
  h.Mkdir("cg/pids/sbx/pool-t1-7/work");
  h.Mkdir("cg/memory/process_api/b393e8e0/sbx/pool-t1-8");
  h.Mkdir("cg/pids/sbx/pool-t2-7/work");
  h.Mkdir("cg/pids/sbx/" + sandbox + "/work");
  auto pooled = (*driver)->StartPool(0, "t1");  // 0: sweep, pool nothing
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_EQ(*pooled, 0);
  EXPECT_FALSE(h.Exists("cg/pids/sbx/pool-t1-7"));
  EXPECT_FALSE(h.Exists("cg/memory/process_api/b393e8e0/sbx/pool-t1-8"));
  EXPECT_TRUE(h.Exists("cg/pids/sbx/pool-t2-7/work"));
  EXPECT_TRUE(h.Exists("cg/pids/sbx/" + sandbox + "/work"));
  EXPECT_FALSE(h.Exists("cg/pids/sbx/pool-t1-0"));  // nothing pooled with size 0
}

// Pure v2 has no rename: nothing is pooled, creates make their directories.
TEST(CgroupPool, PureV2PoolsNothing) {
  FakeHost h;
  auto driver = PureV2Driver(h);
  ASSERT_TRUE(driver.ok()) << driver.status();
  auto pooled = (*driver)->StartPool(4, "t1");
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_EQ(*pooled, 0);
  auto names = ListDir(h.cg("svc/sbx"));
  ASSERT_TRUE(names.ok()) << names.status();
  for (const std::string& n : *names) EXPECT_NE(n.rfind("pool-", 0), 0u) << n;
}

// Pure v2 keeps the agent in a child: the sandbox's directory enables controllers for work/,
// so it may hold no process (no-internal-processes rule).
TEST(CgroupSplit, PureV2KeepsTheAgentChild) {
  FakeHost h;
  auto driver = PureV2Driver(h);
  ASSERT_TRUE(driver.ok()) << driver.status();
  const std::string id = NewId("sbx");
  auto cg = (*driver)->Create(id, SplitLimits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ((*cg)->agent_leaf(), kAgentLeaf);
  const std::string dir = "cg/svc/sbx/" + id;
  EXPECT_EQ(h.Read(dir + "/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(h.Read(dir + "/work/memory.max"), std::to_string(256 << 20));
  EXPECT_EQ(h.Read(dir + "/agent/memory.max"), std::to_string(32 << 20));
  EXPECT_EQ(h.Read(dir + "/agent/pids.max"), "16");
  EXPECT_EQ(h.Read(dir + "/agent/cpu.weight"), std::to_string(kAgentCpuWeight));
  EXPECT_EQ((*cg)->AgentOomCounterPath(), h.cg("svc/sbx/" + id + "/agent/memory.events"));
  (*cg)->Release();
}

TEST(CgroupDetect, CoMountedCpuCpuacct) {
  FakeHost h;
  h.Write("proc/mounts",
          "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0\n"
          "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0\n"
          "cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0\n"
          "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n");
  h.Write("proc/self/cgroup",
          "4:pids:/system.slice/sbxd.service\n"
          "3:memory:/system.slice/sbxd.service\n"
          "2:cpu,cpuacct:/system.slice/sbxd.service\n"
          "0::/system.slice/sbxd.service\n");
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  const std::string id = NewId("sbx");
  auto dirs = ByKey((*driver)->SandboxDirs(id));
  EXPECT_EQ(dirs.size(), 4u);
  EXPECT_EQ(dirs["cpu"], h.cg("cpu,cpuacct/system.slice/sbxd.service/sbx/" + id));
  EXPECT_EQ(dirs["memory"], h.cg("memory/system.slice/sbxd.service/sbx/" + id));
  EXPECT_EQ(dirs["unified"], h.cg("unified/system.slice/sbxd.service/sbx/" + id));
  ASSERT_TRUE((*driver)->Setup().ok());
  auto cg = (*driver)->Create(id, Limits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ(h.Read("cg/cpu,cpuacct/system.slice/sbxd.service/sbx/" + id + "/cpu.cfs_quota_us"),
            "200000");
  (*cg)->Release();
}

TEST(CgroupDetect, PureV2MovesDaemonIntoLeaf) {
  FakeHost h;
  h.Write("proc/mounts",
          "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
          "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n");
  h.Write("proc/self/cgroup", "0::/system.slice/sbxd.service\n");
  const std::string own = "cg/system.slice/sbxd.service";
  h.Write(own + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
  h.Write(own + "/cgroup.subtree_control", "\n");
  h.Write(own + "/cgroup.procs", "4242\n4243\n");

  auto layout = DetectCgroupLayout(h.env());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(layout->pure_v2());
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_EQ((*driver)->Name(), "cgroup-v2");
  EXPECT_TRUE((*driver)->UseCloneIntoCgroup());

  // Before Setup nothing is delegated: creating must fail rather than run unlimited.
  EXPECT_FALSE((*driver)->CheckLimits(Limits()).ok());
  ASSERT_TRUE((*driver)->Setup().ok());
  // The daemon's processes went to the leaf, then the controllers were enabled.
  EXPECT_EQ(h.Read(own + "/sbxd/cgroup.procs"), "4243");  // one pid per write; the last remains
  EXPECT_EQ(h.Read(own + "/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(h.Read(own + "/sbx/cgroup.subtree_control"), "+memory +pids +cpu");

  const std::string id = NewId("sbx");
  auto dirs = ByKey((*driver)->SandboxDirs(id));
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(dirs["unified"], h.cg("system.slice/sbxd.service/sbx/" + id));
  EXPECT_EQ((*driver)->ParentDirs(), std::vector<std::string>{h.cg("system.slice/sbxd.service/sbx")});
  auto cg = (*driver)->Create(id, Limits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  const std::string dir = own + "/sbx/" + id;
  EXPECT_EQ(h.Read(dir + "/memory.max"), std::to_string(256 << 20));
  // memory.oom.group would take the agent down with an OOM-killed workload: never set.
  EXPECT_FALSE(h.Exists(dir + "/memory.oom.group"));
  EXPECT_EQ((*cg)->OomCounterPath(), h.cg("system.slice/sbxd.service/sbx/" + id + "/memory.events"));
  EXPECT_EQ(h.Read(dir + "/pids.max"), "64");
  EXPECT_EQ(h.Read(dir + "/cpu.max"), "200000 100000");
  (*cg)->Release();
}

TEST(CgroupDetect, PureV2AfterRestartUsesParentOfLeaf) {
  FakeHost h;
  h.Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n");
  h.Write("proc/self/cgroup", "0::/system.slice/sbxd.service/sbxd\n");
  const std::string own = "cg/system.slice/sbxd.service";
  h.Write(own + "/cgroup.controllers", "cpu memory pids\n");
  h.Write(own + "/cgroup.subtree_control", "cpu memory pids\n");
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->Setup().ok());
  EXPECT_FALSE(h.Exists(own + "/sbxd/cgroup.procs"));  // already delegated: nothing moved
  const std::string id = NewId("sbx");
  EXPECT_EQ(ByKey((*driver)->SandboxDirs(id))["unified"], h.cg("system.slice/sbxd.service/sbx/" + id));
}

// runtime.ns.cgroup_parent on pure v2: sandboxes go outside sbxd's (systemd unit's) cgroup,
// which keeps no controllers enabled and no processes moved, so systemd can restart sbxd.
TEST(CgroupDetect, PureV2ConfiguredParentLeavesTheUnitCgroupAlone) {
  FakeHost h;
  h.Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n");
  h.Write("proc/self/cgroup", "0::/system.slice/sbxd.service\n");
  const std::string own = "cg/system.slice/sbxd.service";
  h.Write(own + "/cgroup.controllers", "cpu memory pids\n");
  h.Write(own + "/cgroup.subtree_control", "\n");
  h.Write(own + "/cgroup.procs", "4242\n");
  h.Write("cg/cgroup.controllers", "cpuset cpu io memory pids\n");
  h.Write("cg/cgroup.subtree_control", "io\n");
  // The kernel fills a new cgroup's cgroup.controllers from its parent; a fake tree cannot.
  h.Write("cg/sbx/cgroup.controllers", "cpu memory pids\n");
  CgroupEnv env = h.env();
  env.parent = "/sbx";
  auto driver = MakeCgroupDriver(env);
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_FALSE((*driver)->CheckLimits(Limits()).ok());
  ASSERT_TRUE((*driver)->Setup().ok());
  EXPECT_EQ(h.Read("cg/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(h.Read("cg/sbx/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_FALSE(h.Exists(own + "/sbxd")) << "sbxd moved itself although its cgroup stays a leaf";
  EXPECT_EQ(h.Read(own + "/cgroup.subtree_control"), "\n");
  const std::string id = NewId("sbx");
  EXPECT_EQ(ByKey((*driver)->SandboxDirs(id))["unified"], h.cg("sbx/" + id));
  EXPECT_EQ((*driver)->ParentDirs(), std::vector<std::string>{h.cg("sbx")});
  auto cg = (*driver)->Create(id, Limits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ(h.Read("cg/sbx/" + id + "/pids.max"), "64");
  (*cg)->Release();
}

TEST(CgroupDetect, PureV2ConfiguredParentNamesTheAncestorWithoutControllers) {
  FakeHost h;
  h.Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n");
  h.Write("proc/self/cgroup", "0::/system.slice/sbxd.service\n");
  h.Write("cg/cgroup.controllers", "cpu memory pids\n");
  h.Write("cg/cgroup.subtree_control", "cpu memory pids\n");
  h.Write("cg/outer/cgroup.controllers", "cpu\n");
  CgroupEnv env = h.env();
  env.parent = "/outer/sandboxes";
  auto driver = MakeCgroupDriver(env);
  ASSERT_TRUE(driver.ok()) << driver.status();
  absl::Status st = (*driver)->Setup();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(h.cg("outer")), std::string::npos) << st;
  EXPECT_NE(st.message().find("runtime.ns.cgroup_parent"), std::string::npos) << st;
  EXPECT_FALSE((*driver)->Create(NewId("sbx"), Limits()).ok());
}

TEST(CgroupDetect, HybridConfiguredParentIsTheSamePathInEveryHierarchy) {
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  CgroupEnv env = h.env();
  env.parent = "/sbx-sandboxes";
  auto driver = MakeCgroupDriver(env);
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->Setup().ok());
  const std::string id = NewId("sbx");
  auto dirs = ByKey((*driver)->SandboxDirs(id));
  EXPECT_EQ(dirs["memory"], h.cg("memory/sbx-sandboxes/" + id));  // not below process_api
  EXPECT_EQ(dirs["pids"], h.cg("pids/sbx-sandboxes/" + id));
  EXPECT_EQ(dirs["cpu"], h.cg("cpu/sbx-sandboxes/" + id));
  EXPECT_EQ(dirs["unified"], h.cg("unified/sbx-sandboxes/" + id));
  EXPECT_TRUE(h.Exists("cg/memory/sbx-sandboxes"));
}

TEST(CgroupParent, Validation) {
  EXPECT_TRUE(ValidateCgroupParent("").ok());
  EXPECT_TRUE(ValidateCgroupParent("/sbx").ok());
  EXPECT_TRUE(ValidateCgroupParent("/sbx.slice/sandboxes").ok());
  for (const char* bad : {"/", "sbx", "/sbx/", "//sbx", "/a/../b", "/a/./b", "/a b", "/a\\b"}) {
    EXPECT_FALSE(ValidateCgroupParent(bad).ok()) << bad;
  }
  // The driver checks it too, before it touches any hierarchy: no caller can skip the check.
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  CgroupEnv env = h.env();
  env.parent = "/a/../escape";
  auto driver = MakeCgroupDriver(env);
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kInvalidArgument) << driver.status();
  EXPECT_FALSE(h.Exists("cg/memory/escape"));
}

TEST(CgroupDetect, PureV2MissingControllerIsAnError) {
  FakeHost h;
  h.Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n");
  h.Write("proc/self/cgroup", "0::/\n");
  h.Write("cg/cgroup.controllers", "cpu memory\n");
  h.Write("cg/cgroup.subtree_control", "");
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  absl::Status s = (*driver)->Setup();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pids"), std::string::npos) << s;
  EXPECT_FALSE((*driver)->Create(NewId("sbx"), Limits()).ok());
}

TEST(CgroupDetect, V1WithoutV2) {
  FakeHost h;
  h.Write("proc/mounts",
          "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
          "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
          "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpuacct,cpu 0 0\n");
  h.Write("proc/self/cgroup", "3:memory:/\n2:pids:/\n1:cpu,cpuacct:/\n");
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_EQ((*driver)->Name(), "cgroup-v1");
  EXPECT_FALSE((*driver)->UseCloneIntoCgroup());
  const std::string id = NewId("sbx");
  auto dirs = ByKey((*driver)->SandboxDirs(id));
  EXPECT_EQ(dirs.size(), 3u);
  EXPECT_EQ(dirs.count("unified"), 0u);
  EXPECT_EQ(dirs["cpu"], h.cg("cpu,cpuacct/sbx/" + id));
  ASSERT_TRUE((*driver)->Setup().ok());
  auto cg = (*driver)->Create(id, Limits());
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ((*cg)->v2_path(), "");
  EXPECT_EQ((*cg)->OomCounterPath(), h.cg("memory/sbx/" + id + "/memory.oom_control"));
  (*cg)->Release();
}

TEST(CgroupOom, NoMemoryDirectoryMeansNoCounter) {
  SandboxCgroup none("sbx_x", {SandboxCgroup::Dir{"pids", "/x/pids/sbx/sbx_x", false, false}});
  EXPECT_EQ(none.OomCounterPath(), "");
}

TEST(CgroupFreezer, V1OnlyHostsGetAFreezerDirectory) {
  FakeHost h;
  h.Write("proc/mounts",
          "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
          "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
          "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
          "cgroup /sys/fs/cgroup/freezer cgroup rw,freezer 0 0\n");
  h.Write("proc/self/cgroup", "4:freezer:/svc\n3:memory:/\n2:pids:/\n1:cpu:/\n");
  auto layout = DetectCgroupLayout(h.env());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->pure_v2());
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_TRUE((*driver)->CanFreeze());
  const std::string id = NewId("sbx");
  auto dirs = ByKey((*driver)->SandboxDirs(id));
  EXPECT_EQ(dirs.size(), 4u);
  EXPECT_EQ(dirs[kFreezerKey], h.cg("freezer/svc/sbx/" + id));

  // Freeze/thaw through freezer.state (a plain file here: it reads back what was written).
  const std::string rel = "cg/freezer/svc/sbx/" + id;
  h.Write(rel + "/freezer.state", "THAWED\n");
  SandboxCgroup cg(id, {SandboxCgroup::Dir{kFreezerKey, h.cg("freezer/svc/sbx/" + id), false, false}});
  EXPECT_TRUE(cg.CanFreeze());
  EXPECT_FALSE(cg.FreezeRequested().value_or(true));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  ASSERT_TRUE(cg.Freeze(deadline).ok());
  EXPECT_EQ(h.Read(rel + "/freezer.state"), "FROZEN");
  EXPECT_TRUE(cg.FreezeRequested().value_or(false));
  ASSERT_TRUE(cg.Thaw(deadline).ok());
  EXPECT_EQ(h.Read(rel + "/freezer.state"), "THAWED");
  // Kill thaws after signalling, so that v1-frozen tasks can die.
  h.Write(rel + "/freezer.state", "FROZEN\n");
  ASSERT_TRUE(cg.Kill().ok());
  EXPECT_EQ(h.Read(rel + "/freezer.state"), "THAWED");
}

TEST(CgroupFreezer, HybridAndPureV2UseCgroupFreeze) {
  FakeHost h;
  h.Write("proc/mounts", kHybridMounts);
  h.Write("proc/self/cgroup", kHybridSelf);
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_TRUE((*driver)->CanFreeze());
  const std::string id = NewId("sbx");
  // No v1 freezer directory where v2 is there: cgroup.freeze reports completion by itself.
  EXPECT_EQ(ByKey((*driver)->SandboxDirs(id)).count(kFreezerKey), 0u);

  const std::string rel = "cg/unified/sbx/" + id;
  h.Write(rel + "/cgroup.freeze", "0\n");
  h.Write(rel + "/cgroup.events", "populated 1\nfrozen 1\n");
  SandboxCgroup cg(id, {SandboxCgroup::Dir{kUnifiedKey, h.cg("unified/sbx/" + id), true, false}});
  const auto soon = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  ASSERT_TRUE(cg.Freeze(soon).ok());
  EXPECT_EQ(h.Read(rel + "/cgroup.freeze"), "1");
  EXPECT_TRUE(cg.FreezeRequested().value_or(false));
  // cgroup.events of this fake never changes to "frozen 0": the wait ends at the deadline
  // with an error naming the file.
  absl::Status thaw = cg.Thaw(std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(thaw.code(), absl::StatusCode::kDeadlineExceeded) << thaw;
  EXPECT_NE(thaw.message().find("cgroup.events"), std::string::npos) << thaw;
  EXPECT_NE(thaw.message().find(id), std::string::npos) << thaw;
  EXPECT_EQ(h.Read(rel + "/cgroup.freeze"), "0");

  SandboxCgroup none(id, {SandboxCgroup::Dir{"memory", h.cg("memory/x"), false, false}});
  EXPECT_FALSE(none.CanFreeze());
  EXPECT_EQ(none.Freeze(soon).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CgroupDetect, MissingPidsControllerFailsCreate) {
  FakeHost h;
  h.Write("proc/mounts",
          "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
          "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
          "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n");
  h.Write("proc/self/cgroup", "3:memory:/\n2:pids:/\n1:cpu:/\n0::/\n");
  auto driver = MakeCgroupDriver(h.env());
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->Setup().ok());
  absl::Status check = (*driver)->CheckLimits(Limits());
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(check.message().find("pids controller is not mounted"), std::string::npos) << check;
  const std::string id = NewId("sbx");
  auto cg = (*driver)->Create(id, Limits());
  EXPECT_FALSE(cg.ok());
  // Nothing was created for the refused sandbox.
  EXPECT_FALSE(h.Exists("cg/memory/sbx/" + id));
  EXPECT_FALSE(h.Exists("cg/unified/sbx/" + id));
}

// Every limit a sandbox gets must be enforced or the create must fail: a hybrid/v1 host
// lacking any one of the three controllers refuses, and the message names it.
TEST(CgroupLimitsCheck, V1MissingEachControllerFailsCreate) {
  struct Case {
    const char* missing;
    const char* what;
  } cases[] = {{"memory", "memory limit"}, {"pids", "process-count limit"}, {"cpu", "CPU limit"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.missing);
    FakeHost h;
    std::string mounts = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
    for (const char* ctl : {"memory", "pids", "cpu"}) {
      if (std::string(ctl) != c.missing) {
        mounts += fmt::format("cgroup /sys/fs/cgroup/{0} cgroup rw,{0} 0 0\n", ctl);
      }
    }
    h.Write("proc/mounts", mounts);
    h.Write("proc/self/cgroup", "3:memory:/\n2:pids:/\n1:cpu:/\n0::/\n");
    auto driver = MakeCgroupDriver(h.env());
    ASSERT_TRUE(driver.ok()) << driver.status();
    ASSERT_TRUE((*driver)->Setup().ok());
    absl::Status check = (*driver)->CheckLimits(Limits());
    EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition) << check;
    EXPECT_NE(check.message().find(fmt::format("the {} controller is not mounted", c.missing)),
              std::string::npos)
        << check;
    EXPECT_NE(check.message().find(c.what), std::string::npos) << check;
    const std::string id = NewId("sbx");
    auto cg = (*driver)->Create(id, Limits());
    EXPECT_EQ(cg.status().code(), absl::StatusCode::kFailedPrecondition) << cg.status();
    EXPECT_FALSE(h.Exists("cg/unified/sbx/" + id));
    // A limit that is not asked for needs no controller.
    CgroupLimits without = Limits();
    if (std::string(c.missing) == "memory") without.memory_bytes = 0;
    if (std::string(c.missing) == "pids") without.pids = 0;
    if (std::string(c.missing) == "cpu") without.cpu_quota_us = 0;
    EXPECT_TRUE((*driver)->CheckLimits(without).ok());
  }
}

TEST(CgroupLimitsCheck, V2MissingEachControllerFailsCreate) {
  for (const char* missing : {"memory", "pids", "cpu"}) {
    SCOPED_TRACE(missing);
    FakeHost h;
    h.Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n");
    h.Write("proc/self/cgroup", "0::/\n");
    std::string controllers = "io hugetlb";
    for (const char* ctl : {"memory", "pids", "cpu"}) {
      if (std::string(ctl) != missing) controllers += fmt::format(" {}", ctl);
    }
    h.Write("cg/cgroup.controllers", controllers + "\n");
    h.Write("cg/cgroup.subtree_control", "");
    auto driver = MakeCgroupDriver(h.env());
    ASSERT_TRUE(driver.ok()) << driver.status();
    absl::Status setup = (*driver)->Setup();
    EXPECT_EQ(setup.code(), absl::StatusCode::kFailedPrecondition) << setup;
    EXPECT_NE(setup.message().find(missing), std::string::npos) << setup;
    absl::Status check = (*driver)->CheckLimits(Limits());
    EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition) << check;
    const std::string id = NewId("sbx");
    EXPECT_FALSE((*driver)->Create(id, Limits()).ok());
    EXPECT_FALSE(h.Exists("cg/sbx/" + id));
  }
}

TEST(CgroupDetect, NoCgroupsAtAll) {
  FakeHost h;
  h.Write("proc/mounts", "proc /proc proc rw 0 0\n");
  h.Write("proc/self/cgroup", "");
  auto driver = MakeCgroupDriver(h.env());
  EXPECT_FALSE(driver.ok());
  EXPECT_NE(driver.status().message().find("cgroup"), std::string::npos);
}

TEST(CgroupDetect, EscapedMountPoint) {
  FakeHost h;
  h.Write("proc/mounts",
          "cgroup /sys/fs/cgroup/my\\040memory cgroup rw,memory 0 0\n"
          "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
          "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n");
  h.Write("proc/self/cgroup", "3:memory:/a:b\n2:pids:/\n1:cpu:/\n");
  auto layout = DetectCgroupLayout(h.env());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->v1.at("memory").mount, h.cg("my memory"));
  EXPECT_EQ(layout->v1.at("memory").own, "/a:b");  // ':' inside the path survives
}

TEST(CgroupInternal, Join) {
  using cgroup_internal::Join;
  EXPECT_EQ(Join("/sys/fs/cgroup/pids", "/"), "/sys/fs/cgroup/pids");
  EXPECT_EQ(Join("/sys/fs/cgroup/pids/", "/a/b"), "/sys/fs/cgroup/pids/a/b");
  EXPECT_EQ(Join("/", "sbx"), "/sbx");
}

TEST(CgroupCeiling, TheTightestLimitOnThePathToTheRootWins) {
  FakeHost h;
  // v2: the sandboxes' parent has no limit of its own; an ancestor has both.
  h.Write("cg/unified/cgroup.procs", "");
  h.Write("cg/unified/a/memory.max", "2147483648\n");
  h.Write("cg/unified/a/cpu.max", "150000 100000\n");
  h.Write("cg/unified/a/sbx/memory.max", "max\n");
  h.Write("cg/unified/a/sbx/cpu.max", "max 100000\n");
  CgroupCeiling c = ReadCgroupCeiling({h.cg("unified/a/sbx")});
  EXPECT_EQ(c.memory_bytes, int64_t{2147483648});
  EXPECT_EQ(c.cpu_millis, 1500);
  // v1: "unlimited" is LLONG_MAX rounded to a page, quota -1; the tighter of two wins.
  h.Write("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
  h.Write("cg/memory/p/memory.limit_in_bytes", "1073741824\n");
  h.Write("cg/memory/p/sbx/memory.limit_in_bytes", "9223372036854771712\n");
  h.Write("cg/cpu/cpu.cfs_quota_us", "-1\n");
  h.Write("cg/cpu/cpu.cfs_period_us", "100000\n");
  h.Write("cg/cpu/p/sbx/cpu.cfs_quota_us", "-1\n");
  h.Write("cg/cpu/p/sbx/cpu.cfs_period_us", "100000\n");
  c = ReadCgroupCeiling({h.cg("memory/p/sbx"), h.cg("cpu/p/sbx"), h.cg("unified/a/sbx")});
  EXPECT_EQ(c.memory_bytes, int64_t{1073741824});
  EXPECT_EQ(c.cpu_millis, 1500);
  // Nothing set anywhere: no ceiling.
  c = ReadCgroupCeiling({h.cg("cpu/p/sbx")});
  EXPECT_EQ(c.memory_bytes, 0);
  EXPECT_EQ(c.cpu_millis, 0);
}

}  // namespace
}  // namespace sbx::runtime::ns
