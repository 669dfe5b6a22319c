#include "common/path_resolve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx {
namespace {

namespace fs = std::filesystem;

TEST(ValidatePath, Normalizes) {
  EXPECT_EQ(*ValidatePath("/a/./b//c/"), "/a/b/c");
  EXPECT_EQ(*ValidatePath("/"), "/");
  EXPECT_EQ(*ValidatePath("//"), "/");
  EXPECT_EQ(*ValidatePath("a/b/../c"), "/a/c");
  EXPECT_EQ(*ValidatePath("f.txt", "/home/user"), "/home/user/f.txt");
  EXPECT_EQ(*ValidatePath("../f.txt", "/home/user"), "/home/f.txt");
  EXPECT_EQ(*ValidatePath("/abs", "/home/user"), "/abs");
  EXPECT_EQ(*ValidatePath("/t/\xc3\xa9t\xc3\xa9"), "/t/\xc3\xa9t\xc3\xa9");
}

TEST(ValidatePath, Rejects) {
  auto reason = [](std::string_view p, std::string_view wd = "/") {
    auto r = ValidatePath(p, wd);
    EXPECT_FALSE(r.ok()) << p;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << p;
    }
    return r.ok() ? std::string("ok") : ApiErrorCode(r.status());
  };
  EXPECT_EQ(reason(""), "invalid_path");
  EXPECT_EQ(reason(std::string("/a\0b", 4)), "invalid_path");
  EXPECT_EQ(reason("/bad/\xff"), "invalid_path");
  EXPECT_EQ(reason("/surrogate/\xed\xa0\x80"), "invalid_path");
  EXPECT_EQ(reason("/overlong/\xc0\xaf"), "invalid_path");
  EXPECT_EQ(reason("/" + std::string(256, 'a')), "invalid_path");
  EXPECT_EQ(reason(std::string(kMaxPathBytes + 1, 'a')), "invalid_path");
  EXPECT_EQ(reason("../../.."), "path_outside_root");
  EXPECT_EQ(reason("/a/../../etc/passwd"), "path_outside_root");
  EXPECT_EQ(reason("../../x", "/home"), "path_outside_root");
}

TEST(SplitParent, Splits) {
  EXPECT_EQ(SplitParent("/a/b")->first, "/a");
  EXPECT_EQ(SplitParent("/a/b")->second, "b");
  EXPECT_EQ(SplitParent("/a")->first, "/");
  EXPECT_FALSE(SplitParent("/").ok());
}

// A fake sandbox root beside a fake "host" directory, with hostile symlinks inside the root.
class InRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-resolve-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    root_ = base_ / "root";
    outside_ = base_ / "outside";
    fs::create_directories(root_ / "etc");
    fs::create_directories(root_ / "a" / "b");
    fs::create_directories(outside_);
    Write(root_ / "etc" / "passwd", "sandbox\n");
    Write(outside_ / "secret", "host\n");
    fs::create_symlink("/", root_ / "escape");
    fs::create_symlink("/etc/passwd", root_ / "abs");
    fs::create_symlink("../../../../../../..", root_ / "a" / "b" / "up");
    fs::create_symlink(outside_, root_ / "hostdir");  // absolute path of the host's dir
    fs::create_symlink("../a/b/up/a/b/up", root_ / "a" / "chain");
    fs::create_symlink("/proc/self/root", root_ / "magic");
    root_fd_.Reset(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_fd_);
  }
  void TearDown() override { fs::remove_all(base_); }

  static void Write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
  std::string Read(std::string_view path) {
    auto fd = OpenInRoot(root_fd_.get(), path, O_RDONLY);
    if (!fd.ok()) return "error: " + ApiErrorCode(fd.status());
    char buf[256];
    ssize_t n = ::read(fd->get(), buf, sizeof(buf));
    return n < 0 ? "read error" : std::string(buf, static_cast<size_t>(n));
  }

  fs::path base_, root_, outside_;
  UniqueFd root_fd_;
};

TEST_F(InRoot, SymlinksStayInside) {
  EXPECT_EQ(Read("/etc/passwd"), "sandbox\n");
  EXPECT_EQ(Read("/escape/etc/passwd"), "sandbox\n");
  EXPECT_EQ(Read("/abs"), "sandbox\n");
  EXPECT_EQ(Read("/a/b/up/etc/passwd"), "sandbox\n");
  EXPECT_EQ(Read("/a/chain/etc/passwd"), "sandbox\n");
  // The host path the symlink names does not exist inside the root.
  EXPECT_EQ(Read("/hostdir/secret"), "error: not_found");
  EXPECT_EQ(Read("/escape/escape/escape/abs"), "sandbox\n");
}

TEST_F(InRoot, MagicLinksRefused) {
  // /proc/self/root inside this root does not exist; were it a real procfs it would be a
  // magic link, which RESOLVE_NO_MAGICLINKS refuses. Either way nothing outside is reached.
  EXPECT_NE(Read("/magic/etc/passwd"), "host\n");
}

TEST_F(InRoot, ParentOfSymlinkedPath) {
  auto p = OpenParent(root_fd_.get(), "/escape/etc/newfile");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "newfile");
  UniqueFd f(::openat(p->dir.get(), p->name.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  ASSERT_TRUE(f);
  EXPECT_TRUE(fs::exists(root_ / "etc" / "newfile"));
  // A symlink at the last component is not followed by O_NOFOLLOW.
  auto q = OpenParent(root_fd_.get(), "/abs");
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(UniqueFd(::openat(q->dir.get(), q->name.c_str(), O_WRONLY | O_NOFOLLOW)));
}

TEST_F(InRoot, ErrnoMapping) {
  EXPECT_EQ(Read("/nope"), "error: not_found");
  EXPECT_EQ(Read("/etc/passwd/x"), "error: not_a_directory");
}

// A directory is swapped for a symlink to the host's directory in a loop while files are
// created through it: none may ever land outside the root.
TEST_F(InRoot, SwapRaceStaysInside) {
  std::atomic<bool> stop{false};
  const fs::path d = root_ / "d";
  const fs::path tmp_link = root_ / "d.link";
  fs::create_directories(d);
  std::thread swapper([&] {
    const fs::path tmp_dir = root_ / "d.dir";
    while (!stop.load()) {
      std::error_code ec;
      fs::create_symlink(outside_, tmp_link, ec);
      ::renameat2(AT_FDCWD, tmp_link.c_str(), AT_FDCWD, d.c_str(), RENAME_EXCHANGE);
      fs::remove(tmp_link, ec);
      fs::remove_all(tmp_dir, ec);
      fs::create_directories(tmp_dir, ec);
      ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, d.c_str(), RENAME_EXCHANGE);
      fs::remove_all(tmp_dir, ec);
    }
  });
  int created = 0;
  // At least 3000 attempts, and more until one got through: on a loaded machine the swapper
  // can win every one of the first 3000 (bounded to 30 s).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int i = 0; i < 3000 || (created == 0 && std::chrono::steady_clock::now() < give_up);
       ++i) {
    const std::string name = "f" + std::to_string(i);
    auto p = OpenParent(root_fd_.get(), "/d/" + name);
    if (!p.ok()) continue;
    UniqueFd f(::openat(p->dir.get(), p->name.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (f) ++created;
  }
  stop = true;
  swapper.join();
  size_t outside_files = 0;
  for (const auto& e : fs::directory_iterator(outside_)) {
    if (e.path().filename() != "secret") ++outside_files;
  }
  EXPECT_EQ(outside_files, 0u);
  EXPECT_GT(created, 0);
}

// The host's own /proc and /sys stand in for a sandbox's: no change is made, OpenParent refuses
// before any syscall that would change something.
TEST(KernelFs, ChangesUnderKernelFileSystemsAreRefused) {
  UniqueFd root(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  for (const char* path : {"/proc/sys/kernel/sbx-test-new", "/proc/self/sbx-test-new",
                           "/proc/sys/kernel/hostname", "/proc/sbx-test-new"}) {
    auto p = OpenParent(root.get(), path);
    ASSERT_FALSE(p.ok()) << path;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
    EXPECT_EQ(FileErrorReason(p.status()), "permission_denied") << p.status();
    EXPECT_NE(std::string(p.status().message()).find("proc"), std::string::npos) << p.status();
  }
  struct statfs sys {};
  if (::statfs("/sys/kernel", &sys) == 0 && KernelFsName(static_cast<long>(sys.f_type))) {
    auto p = OpenParent(root.get(), "/sys/kernel/sbx-test-new");
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
  }
  // An absent parent stays not_found, an ordinary one is fine.
  EXPECT_EQ(FileErrorReason(OpenParent(root.get(), "/proc-sbx-absent/x").status()), "not_found");
  char tmpl[] = "/tmp/sbx-kernelfs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  EXPECT_TRUE(OpenParent(root.get(), std::string(tmpl) + "/x").ok());
  fs::remove_all(tmpl);
}

TEST(KernelFs, MountPointsAreRefusedForDeleteAndMove) {
  UniqueFd root(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  // "/" is an ordinary parent; its entry "proc" is another file system.
  ParentRef p{UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)), "proc"};
  absl::Status s = RefuseMountPoint(p, "/proc", "delete");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(std::string(s.message()).find("mount point"), std::string::npos) << s;
  ParentRef absent{UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)), "sbx-absent"};
  EXPECT_TRUE(RefuseMountPoint(absent, "/sbx-absent", "delete").ok());
  // EBUSY (a bind mount within one file system) is a refusal too, not a 503.
  EXPECT_EQ(FileErrorReason(FileErrnoStatus(EBUSY, "delete /x: unlinkat")), "permission_denied");
}

}  // namespace
}  // namespace sbx
