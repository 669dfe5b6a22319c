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
  absl::Status Extract(std::string_view tar, std::optional<uint64_t> cap = std::nullopt) {
    Extractor x(base_.get(), "/into", cap);
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

TEST_F(Untar, RefusesEscapesAndHardLinks) {
  absl::Status s = Extract(BuildTar({{File("/abs", 1), "x"}}));
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
  s = Extract(BuildTar({{File("../up", 1), "x"}}));
  EXPECT_FALSE(s.ok());
  s = Extract(BuildTar({{File("f", 1), "x"}, {Link("h", "f", TarType::kHardLink), ""}}));
  EXPECT_EQ(ApiErrorCode(s), "invalid_tar") << s;
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
