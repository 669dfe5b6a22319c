#include "archive/untar.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "archive/tar_test_util.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::archive {
namespace {

namespace fs = std::filesystem;

TarEntry File(std::string name, uint64_t size, uint32_t mode = 0644) {
  return TarEntry{std::move(name), TarType::kFile, mode, 0, 0, 1700000000, size, ""};
}

TarEntry Link(std::string name, std::string target, TarType type = TarType::kSymlink) {
  return TarEntry{std::move(name), type, 0777, 0, 0, 0, 0, std::move(target)};
}

std::string Slurp(const fs::path& p) {
  std::stringstream ss;
  ss << std::ifstream(p, std::ios::binary).rdbuf();
  return ss.str();
}

class Untar : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-untar-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    top_ = tmpl;
    fs::create_directories(top_ / "into");
    base_.Reset(::open((top_ / "into").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(base_);
  }
  void TearDown() override { fs::remove_all(top_); }

  // Extracts `tar` handed out in pieces of 100 bytes.
  absl::Status Extract(std::string_view tar, std::optional<uint64_t> cap = std::nullopt,
                       std::optional<size_t> link_budget = std::nullopt) {
    Extractor x(base_.get(), "/into", cap);
    if (link_budget) x.SetLinkTargetBudget(*link_budget);
    size_t at = 0;
    absl::Status s = x.Run([&]() -> absl::StatusOr<std::string_view> {
      const std::string_view next = tar.substr(std::min(at, tar.size()), 100);
      at += next.size();
      return next;
    });
    entries_ = x.entries();
    // After the archive's end the rest of the input is read; an error stops at once.
    if (s.ok()) {
      EXPECT_EQ(at, tar.size());
    }
    return s;
  }

  fs::path top_;
  UniqueFd base_;
  int entries_ = 0;
};

TEST_F(Untar, ExtractsFilesDirectoriesAndSymlinks) {
  TarEntry dir{"d", TarType::kDirectory, 0750, 0, 0, 0, 0, ""};
  const std::string tar = BuildTar({{dir, ""},
                                 {File("d/x.sh", 5, 0755), "hello"},
                                 {File("d/empty", 0), ""},
                                 {Link("d/l", "x.sh"), ""}});
  ASSERT_TRUE(Extract(tar).ok());
  EXPECT_EQ(entries_, 4);
  EXPECT_EQ(Slurp(top_ / "into/d/x.sh"), "hello");
  EXPECT_EQ(fs::status(top_ / "into/d/x.sh").permissions() & fs::perms::all, fs::perms(0755));
  EXPECT_EQ(fs::file_size(top_ / "into/d/empty"), 0u);
  EXPECT_EQ(fs::read_symlink(top_ / "into/d/l"), "x.sh");
}

TEST_F(Untar, RefusesEscapes) {
  absl::Status s = Extract(BuildTar({{File("/abs", 1), "x"}}));
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
  s = Extract(BuildTar({{File("../up", 1), "x"}}));
  EXPECT_FALSE(s.ok());
  // A symlink out, then a file through it: resolved inside the directory, where /elsewhere
  // does not exist.
  fs::create_directories(top_ / "elsewhere");
  s = Extract(BuildTar({{Link("out", "/elsewhere"), ""}, {File("out/pwned", 1), "x"}}));
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
  EXPECT_FALSE(fs::exists(top_ / "abs"));
  EXPECT_FALSE(fs::exists(top_ / "up"));
  EXPECT_FALSE(fs::exists(top_ / "elsewhere/pwned"));
  // `..` through a symlink stops at the directory: the file lands inside it.
  ASSERT_TRUE(Extract(BuildTar({{Link("up2", "../../.."), ""}, {File("up2/in", 2), "ok"}})).ok());
  EXPECT_EQ(Slurp(top_ / "into/in"), "ok");
}

TEST_F(Untar, HardLinksToFilesOfTheArchive) {
  ASSERT_TRUE(Extract(BuildTar({{File("d/f", 2), "hi"},
                                {Link("e/h", "d/f", TarType::kHardLink), ""},
                                {Link("./h2", "./d/../d/f", TarType::kHardLink), ""}}))
                  .ok());
  struct stat a {}, b {}, c {};
  ASSERT_EQ(::stat((top_ / "into/d/f").c_str(), &a), 0);
  ASSERT_EQ(::stat((top_ / "into/e/h").c_str(), &b), 0);
  ASSERT_EQ(::stat((top_ / "into/h2").c_str(), &c), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_ino, c.st_ino);
  EXPECT_EQ(a.st_nlink, 3u);
}

// A hard link may name only a regular file this archive made: not one already in the tree,
// not one outside it, not a directory or a symlink, not itself.
TEST_F(Untar, HardLinksElsewhereAreRefused) {
  std::ofstream(top_ / "into/existing") << "secret";
  std::ofstream(top_ / "outside") << "secret";
  const std::vector<std::vector<std::pair<TarEntry, std::string>>> cases = {
      {{Link("h", "existing", TarType::kHardLink), ""}},
      {{Link("h", "../outside", TarType::kHardLink), ""}},
      {{Link("h", "/outside", TarType::kHardLink), ""}},
      {{Link("h", "missing", TarType::kHardLink), ""}},
      {{TarEntry{"d", TarType::kDirectory, 0755, 0, 0, 0, 0, ""}, ""},
       {Link("h", "d", TarType::kHardLink), ""}},
      {{Link("s", "existing"), ""}, {Link("h", "s", TarType::kHardLink), ""}},
      {{Link("h", "h", TarType::kHardLink), ""}},
      // A file the archive made, then replaced by a symlink: the name is no longer a file.
      {{File("f", 1), "x"}, {Link("f", "/outside"), ""}, {Link("h", "f", TarType::kHardLink), ""}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::Status s = Extract(BuildTar(cases[i]));
    EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << "case " << i << ": " << s;
    EXPECT_FALSE(fs::exists(fs::symlink_status(top_ / "into/h"))) << "case " << i;
  }
  struct stat st {};
  ASSERT_EQ(::stat((top_ / "outside").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  ASSERT_EQ(::stat((top_ / "into/existing").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
}

// The names kept as link targets are bounded: past the budget files are still made, a link to
// one that did not fit is refused saying why, links to those kept still work, and a name
// forgotten (replaced) gives its bytes back.
TEST_F(Untar, LinkTargetsAreBounded) {
  absl::Status s = Extract(BuildTar({{File("aaaa", 1), "a"},
                                     {File("bbbb", 1), "b"},
                                     {File("cccc", 1), "c"},  // 12 bytes of names > 10
                                     {Link("ha", "aaaa", TarType::kHardLink), ""},
                                     {Link("hb", "bbbb", TarType::kHardLink), ""}}),
                           std::nullopt, /*link_budget=*/10);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(fs::hard_link_count(top_ / "into/aaaa"), 2u);
  EXPECT_EQ(fs::hard_link_count(top_ / "into/bbbb"), 2u);
  fs::remove_all(top_ / "into");
  fs::create_directories(top_ / "into");
  base_.Reset(::open((top_ / "into").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  s = Extract(BuildTar({{File("aaaa", 1), "a"},
                        {File("bbbb", 1), "b"},
                        {File("cccc", 1), "c"},
                        {Link("hc", "cccc", TarType::kHardLink), ""}}),
              std::nullopt, 10);
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
  EXPECT_NE(std::string(s.message()).find("only the first 10 bytes of file names"),
            std::string::npos)
      << s;
  EXPECT_TRUE(fs::exists(top_ / "into/cccc"));  // the file itself was made
  EXPECT_FALSE(fs::exists(fs::symlink_status(top_ / "into/hc")));
  // A name replaced by a symlink is forgotten: its bytes make room for the next file.
  fs::remove_all(top_ / "into");
  fs::create_directories(top_ / "into");
  base_.Reset(::open((top_ / "into").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  s = Extract(BuildTar({{File("aaaa", 1), "a"},
                        {File("bbbb", 1), "b"},
                        {Link("aaaa", "bbbb"), ""},
                        {File("cccc", 1), "c"},
                        {Link("hc", "cccc", TarType::kHardLink), ""}}),
              std::nullopt, 10);
  EXPECT_TRUE(s.ok()) << s;
  // The default is 16 MiB.
  EXPECT_EQ(Extractor::kLinkTargetBytes, size_t{16} << 20);
}

// SetOwner: every entry made is owned by the given ids, whatever the archive says; a file's
// setuid bit survives the chown (the mode is applied after it).
TEST_F(Untar, OwnerForEveryEntry) {
  // Root in CI; elsewhere only our own ids can be given away.
  const uid_t uid = ::geteuid() == 0 ? 12345 : ::geteuid();
  const gid_t gid = ::geteuid() == 0 ? 23456 : ::getegid();
  TarEntry f = File("d/f", 1, 04755);
  f.uid = 7;
  f.gid = 8;
  Extractor x(base_.get(), "/into", std::nullopt);
  x.SetOwner(uid, gid);
  const std::string tar = BuildTar({{TarEntry{"d", TarType::kDirectory, 0755, 0, 0, 0, 0, ""}, ""},
                                    {f, "x"},
                                    {Link("d/l", "f"), ""},
                                    {File("p/q/g", 1), "y"}});
  bool done = false;
  ASSERT_TRUE(x.Run([&]() -> absl::StatusOr<std::string_view> {
                 if (done) return std::string_view();
                 done = true;
                 return std::string_view(tar);
               }).ok());
  // Parents the archive does not list are made for the owner too; "into" itself was there.
  for (const char* n : {"into/d", "into/d/f", "into/d/l", "into/p", "into/p/q", "into/p/q/g"}) {
    struct stat st {};
    ASSERT_EQ(::lstat((top_ / n).c_str(), &st), 0) << n;
    EXPECT_EQ(st.st_uid, uid) << n;
    EXPECT_EQ(st.st_gid, gid) << n;
  }
  struct stat st {};
  ASSERT_EQ(::stat((top_ / "into/d/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  ASSERT_EQ(::stat((top_ / "into").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

TEST_F(Untar, MalformedArchivesAreInvalidTar) {
  absl::Status s = Extract(std::string(1000, 'n'));
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
  const std::string good = BuildTar({{File("a", 600), std::string(600, 'a')}});
  s = Extract(std::string_view(good).substr(0, 700));  // cut in the middle of the data
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
}

TEST_F(Untar, DiskCap) {
  const std::string tar = BuildTar({{File("a", 600), std::string(600, 'a')}});
  absl::Status s = Extract(tar, 500);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(ApiErrorCode(s), "payload_too_large");
  EXPECT_TRUE(Extract(tar, 600).ok());
}

// The source's own errors are the caller's (a broken connection, an unexpected frame), not a
// malformed archive.
TEST_F(Untar, SourceErrorsComeBackAsTheyAre) {
  Extractor x(base_.get(), "/into", std::nullopt);
  absl::Status s = x.Run([]() -> absl::StatusOr<std::string_view> {
    return absl::InvalidArgumentError("untar: unexpected frame type");
  });
  EXPECT_EQ(s, absl::InvalidArgumentError("untar: unexpected frame type"));
  EXPECT_EQ(ApiErrorCode(s), "");
}

}  // namespace
}  // namespace sbx::archive
