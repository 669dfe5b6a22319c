// Backend construction and Probe() diagnostics (no root, no sandbox is started).
#include "runtime/ns/ns_backend.h"

#include <stdlib.h>

#include <gtest/gtest.h>

#include "common/ids.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sbx-nsbackend-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { EXPECT_TRUE(RemoveTree(path_).ok()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A fake host: v1 memory/pids/cpu, no v2.
NsOptions FakeHostOptions(const TempDir& t) {
  EXPECT_TRUE(MkdirAll(t.path() + "/proc/self", 0755).ok());
  EXPECT_TRUE(WriteStringToFile(t.path() + "/proc/mounts",
                                "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
                                "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
                                "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n",
                                true)
                  .ok());
  EXPECT_TRUE(
      WriteStringToFile(t.path() + "/proc/self/cgroup", "3:memory:/\n2:pids:/\n1:cpu:/\n", true).ok());
  EXPECT_TRUE(WriteStringToFile(t.path() + "/proc/filesystems", "nodev\toverlay\n", true).ok());
  NsOptions o;
  o.state_dir = t.path() + "/state";
  o.agent_path = t.path() + "/no-such-agent";
  o.cgroup_root_override = t.path() + "/cg";
  o.proc_root = t.path() + "/proc";
  return o;
}

TEST(NsBackend, ProbeNamesWhatIsMissing) {
  TempDir t;
  NsBackend backend(FakeHostOptions(t));
  EXPECT_EQ(backend.Name(), "ns");
  EXPECT_EQ(backend.CgroupDriverName(), "cgroup-v1");
  absl::Status s = backend.Probe();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(s.message());
  EXPECT_NE(msg.find("agent binary"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no-such-agent"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("overlayfs"), std::string::npos) << msg;

  // Create refuses before touching anything.
  SandboxSpec spec;
  spec.id = NewId("sbx");
  auto created = backend.Create(spec);
  EXPECT_FALSE(created.ok());
  auto names = ListDir(t.path() + "/state/sandboxes");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_TRUE(names->empty());
}

TEST(NsBackend, PathsAreNamedAfterTheId) {
  TempDir t;
  NsBackend backend(FakeHostOptions(t));
  const std::string id = NewId("sbx");
  EXPECT_EQ(backend.SandboxDir(id), t.path() + "/state/sandboxes/" + id);
  auto paths = backend.CgroupPaths(id);
  EXPECT_EQ(paths["memory"], t.path() + "/cg/memory/sbx/" + id);
  EXPECT_EQ(paths["pids"], t.path() + "/cg/pids/sbx/" + id);
  EXPECT_EQ(paths["cpu"], t.path() + "/cg/cpu/sbx/" + id);
}

TEST(NsBackend, RelativeStateDirIsReported) {
  TempDir t;
  NsOptions o = FakeHostOptions(t);
  o.state_dir = "relative/state";
  NsBackend backend(o);
  absl::Status s = backend.Probe();
  EXPECT_NE(s.message().find("state_dir must be an absolute path"), std::string::npos) << s;
}

}  // namespace
}  // namespace sbx::runtime::ns
