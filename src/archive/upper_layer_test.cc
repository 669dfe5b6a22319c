// WriteUpperAsLayer against a real overlayfs upper: changes made through an overlay mount
// (a new file, a deleted one, a replaced directory, links, an owner in the sandbox's range)
// come out as the OCI layer entries that mean the same. Root (overlayfs and trusted.* xattrs);
// skips without it, fails instead when SBX_TESTS_MUST_RUN=1.
#include "archive/upper_layer.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "archive/tar.h"
#include "common/digest.h"
#include "common/test_util.h"
#include "common/unique_fd.h"

namespace sbx::archive {
namespace {

namespace fs = std::filesystem;

struct Seen {
  TarType type;
  uint32_t uid, gid, mode;
  std::string linkname;
  std::string data;
};

std::map<std::string, Seen> ReadTar(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool given = false;
  TarReader r([&]() -> absl::StatusOr<std::string_view> {
    if (given) return std::string_view();
    given = true;
    return std::string_view(all);
  });
  std::map<std::string, Seen> out;
  for (;;) {
    auto e = r.Next();
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok() || !e->has_value()) break;
    Seen s{(*e)->type, (*e)->uid, (*e)->gid, (*e)->mode, (*e)->linkname, ""};
    for (;;) {
      auto p = r.Read();
      EXPECT_TRUE(p.ok());
      if (!p.ok() || p->bytes.empty()) break;
      s.data.append(p->bytes);
    }
    out[(*e)->name] = s;
  }
  return out;
}

class UpperExport : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) SBX_SKIP_OR_FAIL("needs root (overlayfs)");
    char tmpl[] = "/tmp/sbx-upper-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* d : {"lower", "upper", "work", "merged"}) fs::create_directories(dir_ + "/" + d);
    fs::create_directories(dir_ + "/lower/etc/old");
    std::ofstream(dir_ + "/lower/etc/old/a") << "a";
    std::ofstream(dir_ + "/lower/etc/gone") << "gone";
    std::ofstream(dir_ + "/lower/keep") << "keep";
    const std::string opts = "lowerdir=" + dir_ + "/lower,upperdir=" + dir_ + "/upper,workdir=" +
                             dir_ + "/work";
    ASSERT_EQ(::mount("overlay", (dir_ + "/merged").c_str(), "overlay", 0, opts.c_str()), 0)
        << strerror(errno);
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2((dir_ + "/merged").c_str(), MNT_DETACH);
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void Unmount() {
    ASSERT_EQ(::umount2((dir_ + "/merged").c_str(), 0), 0);
    mounted_ = false;
  }

  std::string dir_;
  bool mounted_ = false;
};

TEST_F(UpperExport, ChangesThroughAnOverlayBecomeTheLayerEntriesThatMeanTheSame) {
  const std::string m = dir_ + "/merged";
  const uint32_t base = 0x90000;
  fs::remove(m + "/etc/gone");                  // a whiteout
  fs::remove_all(m + "/etc/old");               // replaced: an opaque directory
  fs::create_directories(m + "/etc/old");
  std::ofstream(m + "/etc/old/b") << "bee";
  std::ofstream(m + "/app.py") << "print(1)\n";
  ASSERT_EQ(::chown((m + "/app.py").c_str(), base + 1000, base + 1000), 0);
  ASSERT_EQ(::chmod((m + "/app.py").c_str(), 04755), 0);
  ASSERT_EQ(::link((m + "/app.py").c_str(), (m + "/app2.py").c_str()), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (m + "/lnk").c_str()), 0);
  ASSERT_EQ(::mkfifo((m + "/fifo").c_str(), 0600), 0);
  Unmount();

  UniqueFd upper(::open((dir_ + "/upper").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(upper.valid());
  const std::string tar = dir_ + "/layer.tar";
  UniqueFd out(::open(tar.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  auto layer = WriteUpperAsLayerFile(upper.get(), base, 65536, out.get());
  ASSERT_TRUE(layer.ok()) << layer.status();
  out.Reset();

  std::ifstream in(tar, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(layer->diff_id, Sha256Digest(bytes));
  EXPECT_EQ(layer->tar_bytes, bytes.size());

  auto e = ReadTar(tar);
  ASSERT_TRUE(e.count("etc/.wh.gone")) << "a deleted lower file is a whiteout entry";
  EXPECT_EQ(e["etc/.wh.gone"].type, TarType::kFile);
  ASSERT_TRUE(e.count("etc/old/.wh..wh..opq")) << "a replaced directory is opaque";
  EXPECT_EQ(e["etc/old/b"].data, "bee");
  EXPECT_FALSE(e.count("etc/old/a"));
  EXPECT_FALSE(e.count("keep")) << "unchanged lower files are not in the layer";
  ASSERT_TRUE(e.count("app.py"));
  EXPECT_EQ(e["app.py"].uid, 1000u) << "host ids of the sandbox's range are shifted back";
  EXPECT_EQ(e["app.py"].gid, 1000u);
  EXPECT_EQ(e["app.py"].mode, 04755u);
  EXPECT_EQ(e["app.py"].data, "print(1)\n");
  ASSERT_TRUE(e.count("app2.py"));
  EXPECT_EQ(e["app2.py"].type, TarType::kHardLink);
  EXPECT_EQ(e["app2.py"].linkname, "app.py");
  EXPECT_EQ(e["lnk"].type, TarType::kSymlink);
  EXPECT_EQ(e["lnk"].linkname, "/etc/passwd") << "a link is written, never followed";
  EXPECT_EQ(e["fifo"].type, TarType::kFifo);
  EXPECT_EQ(e["etc"].uid, 0u) << "an owner outside the range (host root) is 0";

  // The same changes, the same diff_id (the build cache keys on it).
  UniqueFd again(::open((dir_ + "/again.tar").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  auto second = WriteUpperAsLayerFile(upper.get(), base, 65536, again.get());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->diff_id, layer->diff_id);
}

TEST_F(UpperExport, TooManyEntriesStopTheWalk) {
  for (int i = 0; i < 10; ++i) std::ofstream(dir_ + "/merged/f" + std::to_string(i)) << i;
  Unmount();
  UniqueFd upper(::open((dir_ + "/upper").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd out(::open((dir_ + "/m.tar").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  auto layer = WriteUpperAsLayerFile(upper.get(), 0, 65536, out.get(), {}, 5);
  EXPECT_TRUE(absl::IsResourceExhausted(layer.status())) << layer.status();
  EXPECT_NE(layer.status().message().find("max_entries_per_layer"), std::string::npos);
}

TEST_F(UpperExport, NestingPastTheBoundStopsTheWalkWithoutRecursion) {
  std::string path = dir_ + "/merged";
  for (int i = 0; i < kMaxUpperDepth + 10; ++i) {
    path += "/d";
    ASSERT_EQ(::mkdir(path.c_str(), 0755), 0) << i << ": " << strerror(errno);
  }
  Unmount();
  UniqueFd upper(::open((dir_ + "/upper").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd out(::open((dir_ + "/n.tar").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  auto layer = WriteUpperAsLayerFile(upper.get(), 0, 65536, out.get());
  EXPECT_TRUE(absl::IsResourceExhausted(layer.status())) << layer.status();
  EXPECT_NE(layer.status().message().find("nested deeper"), std::string::npos);
}

TEST_F(UpperExport, CancelStopsTheWalk) {
  std::ofstream(dir_ + "/merged/x") << "x";
  Unmount();
  UniqueFd upper(::open((dir_ + "/upper").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd out(::open((dir_ + "/c.tar").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  auto layer = WriteUpperAsLayerFile(upper.get(), 0, 65536, out.get(), [] { return true; });
  EXPECT_TRUE(absl::IsCancelled(layer.status())) << layer.status();
}

}  // namespace
}  // namespace sbx::archive
