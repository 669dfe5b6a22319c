// Loop devices: attach, autoclear, races between attachers, the start-up sweep. Root; skips
// without it, fails instead when SBX_TESTS_MUST_RUN=1.
#include "runtime/ns/loop_device.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <atomic>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/test_util.h"

#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

// Polls: the kernel detaches an autoclear device at the last close, but give slow kernels time.
// Until `loop_name` no longer shows `backing`: detached (not found), or already taken by
// another process for its own file (parallel tests attach in bursts).
bool WaitDetached(const std::string& loop_name, const std::string& backing) {
  for (int i = 0; i < 500; ++i) {
    auto now = LoopBackingFile(loop_name);
    if (absl::IsNotFound(now.status()) || (now.ok() && *now != backing)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(BackingFileUnder, MatchesWholeComponentsOnly) {
  EXPECT_TRUE(BackingFileUnder("/var/lib/sbx/sandboxes/a/disk.img", "/var/lib/sbx"));
  EXPECT_TRUE(BackingFileUnder("/var/lib/sbx/sandboxes/a/disk.img", "/var/lib/sbx/"));
  EXPECT_TRUE(BackingFileUnder("/var/lib/sbx/x.img (deleted)", "/var/lib/sbx"));
  EXPECT_FALSE(BackingFileUnder("/var/lib/sbx2/x.img", "/var/lib/sbx"));
  EXPECT_FALSE(BackingFileUnder("/var/lib/x.img", "/var/lib/sbx"));
  EXPECT_FALSE(BackingFileUnder("/var/lib/sbx/x.img", ""));
  EXPECT_FALSE(BackingFileUnder("/var/lib/sbx/x.img", "relative"));
  EXPECT_FALSE(BackingFileUnder("", "/var/lib/sbx"));
}

class LoopDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      SBX_SKIP_OR_FAIL("loop device tests need root");
    }
    if (::access("/dev/loop-control", R_OK | W_OK) != 0) {
      SBX_SKIP_OR_FAIL("no /dev/loop-control");
    }
    char tmpl[] = "/tmp/sbx-loop-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    char* real = ::realpath(tmpl, nullptr);
    ASSERT_NE(real, nullptr);
    dir_ = real;
    ::free(real);
  }

  void TearDown() override {
    // Whatever a failed test left attached to our files (test-made non-autoclear devices).
    if (!dir_.empty()) {
      (void)SweepLoopDevices(dir_);
      (void)RemoveTree(dir_);
    }
  }

  std::string MakeFile(const std::string& name, off_t size = 4 << 20) {
    std::string path = dir_ + "/" + name;
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    EXPECT_TRUE(fd.valid()) << path << ": " << std::strerror(errno);
    EXPECT_EQ(::ftruncate(fd.get(), size), 0);
    return path;
  }

  // A device attached the way `losetup` does it (no autoclear), then left with no opener: what
  // the sweep is for. Returns the loop name.
  std::string AttachWithoutAutoclear(const std::string& path) {
    UniqueFd file(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    UniqueFd ctl(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
    for (int attempt = 0; attempt < 32; ++attempt) {
      int n = ::ioctl(ctl.get(), LOOP_CTL_GET_FREE);
      if (n < 0) break;
      UniqueFd dev(::open(fmt::format("/dev/loop{}", n).c_str(), O_RDWR | O_CLOEXEC));
      struct loop_config cfg{};
      cfg.fd = static_cast<uint32_t>(file.get());
      if (dev && ::ioctl(dev.get(), LOOP_CONFIGURE, &cfg) == 0) return fmt::format("loop{}", n);
    }
    ADD_FAILURE() << "could not attach " << path;
    return "";
  }

  std::string dir_;
};

TEST_F(LoopDeviceTest, AttachShowsBackingFileAndAutoclearsOnClose) {
  std::string path = MakeFile("a.img");
  UniqueFd file(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  auto loop = LoopDevice::Attach(file.get(), path);
  ASSERT_TRUE(loop.ok()) << loop.status();
  file.Reset();  // the device keeps its own reference
  EXPECT_EQ(loop->path(), "/dev/" + loop->name());
  auto backing = LoopBackingFile(loop->name());
  ASSERT_TRUE(backing.ok()) << backing.status();
  EXPECT_EQ(*backing, path);
  auto autoclear = ReadFileToString(fmt::format("/sys/block/{}/loop/autoclear", loop->name()));
  ASSERT_TRUE(autoclear.ok());
  EXPECT_EQ(*autoclear, "1\n");
  // The size is the file's: a read of the block device sees it.
  off_t end = ::lseek(loop->fd(), 0, SEEK_END);
  EXPECT_EQ(end, 4 << 20);
  std::string name = loop->name();
  loop->Close();
  EXPECT_TRUE(WaitDetached(name, path)) << name << " still attached after its last close";
}

TEST_F(LoopDeviceTest, ConcurrentAttachesGetDistinctDevices) {
  constexpr int kThreads = 6;
  std::vector<std::string> paths;
  for (int i = 0; i < kThreads; ++i) paths.push_back(MakeFile(fmt::format("c{}.img", i)));
  std::vector<absl::StatusOr<LoopDevice>> results;
  for (int i = 0; i < kThreads; ++i) results.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      UniqueFd f(::open(paths[i].c_str(), O_RDWR | O_CLOEXEC));
      results[i] = LoopDevice::Attach(f.get(), paths[i]);
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> numbers;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    numbers.insert(results[i]->number());
    auto backing = LoopBackingFile(results[i]->name());
    ASSERT_TRUE(backing.ok());
    EXPECT_EQ(*backing, paths[i]);
  }
  EXPECT_EQ(numbers.size(), static_cast<size_t>(kThreads));
  std::vector<std::string> names;
  for (auto& r : results) {
    names.push_back(r->name());
    r->Close();
  }
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(WaitDetached(names[i], paths[i])) << names[i];
  }
}

// A burst of creates attaches many disks at once while deleted sandboxes' devices detach:
// LOOP_CTL_GET_FREE names the same free device to every attacher that asks at the same time,
// so without serialization the Nth of them lost N-1 races and a burst of 50 ran out of
// attempts (EBUSY) and failed a create.
TEST_F(LoopDeviceTest, ABurstOfAttachesBesideDetachesAllSucceed) {
  constexpr int kThreads = 48;
  constexpr int kRounds = 3;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::string> paths;
    for (int i = 0; i < kThreads; ++i) paths.push_back(MakeFile(fmt::format("b{}-{}.img", round, i)));
    std::vector<absl::StatusOr<LoopDevice>> results;
    for (int i = 0; i < kThreads; ++i) results.emplace_back(absl::UnknownError("not run"));
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        UniqueFd f(::open(paths[i].c_str(), O_RDWR | O_CLOEXEC));
        while (!go.load()) std::this_thread::yield();
        results[i] = LoopDevice::Attach(f.get(), paths[i]);
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    std::set<int> numbers;
    for (int i = 0; i < kThreads; ++i) {
      ASSERT_TRUE(results[i].ok()) << "round " << round << ": " << results[i].status();
      numbers.insert(results[i]->number());
    }
    EXPECT_EQ(numbers.size(), static_cast<size_t>(kThreads));
    // Detached (autoclear on the last close) while the next round attaches.
    for (auto& r : results) r->Close();
  }
}

TEST_F(LoopDeviceTest, BackingFileFollowsRenameAndShowsDeletion) {
  std::string path = MakeFile("r.img");
  UniqueFd file(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  auto loop = LoopDevice::Attach(file.get(), path);
  ASSERT_TRUE(loop.ok()) << loop.status();
  ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0700), 0);
  std::string moved = dir_ + "/sub/moved.img";
  ASSERT_EQ(::rename(path.c_str(), moved.c_str()), 0);
  EXPECT_EQ(LoopBackingFile(loop->name()).value_or(""), moved);
  ASSERT_EQ(::unlink(moved.c_str()), 0);
  std::string deleted = LoopBackingFile(loop->name()).value_or("");
  EXPECT_EQ(deleted, moved + " (deleted)");
  EXPECT_TRUE(BackingFileUnder(deleted, dir_));
}

TEST_F(LoopDeviceTest, SweepDetachesOnlyDevicesUnderTheDirectory) {
  ASSERT_EQ(::mkdir((dir_ + "/ours").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir_ + "/other").c_str(), 0700), 0);
  std::string ours = AttachWithoutAutoclear(MakeFile("ours/leak.img"));
  std::string other = AttachWithoutAutoclear(MakeFile("other/keep.img"));
  ASSERT_FALSE(ours.empty());
  ASSERT_FALSE(other.empty());
  // One of ours still in use: held open, as a mount would hold it.
  std::string busy_path = MakeFile("ours/busy.img");
  UniqueFd busy_file(::open(busy_path.c_str(), O_RDWR | O_CLOEXEC));
  auto busy = LoopDevice::Attach(busy_file.get(), busy_path);
  ASSERT_TRUE(busy.ok()) << busy.status();

  auto swept = SweepLoopDevices(dir_ + "/ours");
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_EQ(swept->detached, 1);
  EXPECT_EQ(swept->in_use, 1);
  // Detached: the device no longer shows our file. Not "not found": another process (a
  // parallel test's burst of attaches) may already have taken the freed device for its own.
  EXPECT_NE(LoopBackingFile(ours).value_or(""), dir_ + "/ours/leak.img");
  EXPECT_EQ(LoopBackingFile(other).value_or(""), dir_ + "/other/keep.img");
  EXPECT_TRUE(LoopBackingFile(busy->name()).ok()) << "a device in use must survive the sweep";
  std::string busy_name = busy->name();
  busy->Close();
  EXPECT_TRUE(WaitDetached(busy_name, busy_path));

  // The other directory's device: detached by TearDown's sweep of the whole test dir, which
  // checks the sweep a second time.
  auto all = SweepLoopDevices(dir_);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->detached, 1);
  EXPECT_NE(LoopBackingFile(other).value_or(""), dir_ + "/other/keep.img");
}

}  // namespace
}  // namespace sbx::runtime::ns
