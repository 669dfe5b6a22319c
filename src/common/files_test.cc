#include "common/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace sbx {
namespace {

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-files-test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const char* n : {"/f", "/g"}) ::unlink((dir_ + n).c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_;
};

TEST_F(Files, WriteThenReadRoundTripsBytesAndTruncates) {
  std::string bytes("a\0b\n", 4);
  bytes += std::string(100000, 'x');  // over one read(2) buffer
  ASSERT_TRUE(WriteFileContents(dir_ + "/f", bytes).ok());
  auto back = ReadFileToString(dir_ + "/f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  ASSERT_TRUE(WriteFileContents(dir_ + "/f", "short").ok());
  EXPECT_EQ(ReadFileOrEmpty(dir_ + "/f"), "short");
  ASSERT_TRUE(WriteFileContents(dir_ + "/f", "").ok());
  EXPECT_EQ(ReadFileOrEmpty(dir_ + "/f"), "");
}

TEST_F(Files, ANewFileGetsTheModeAsTheUmaskAllows) {
  const mode_t old = ::umask(022);
  ASSERT_TRUE(WriteFileContents(dir_ + "/f", "x", 0600).ok());
  ASSERT_TRUE(WriteFileContents(dir_ + "/g", "x").ok());
  ::umask(old);
  struct stat st{};
  ASSERT_EQ(::stat((dir_ + "/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir_ + "/g").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST_F(Files, ErrorsNameThePathTheSyscallAndErrno) {
  auto missing = ReadFileToString(dir_ + "/none");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("open(" + dir_ + "/none)"), std::string::npos)
      << missing.status();
  EXPECT_EQ(ReadFileOrEmpty(dir_ + "/none"), "");
  // A directory opens for reading but read(2) fails (EISDIR): the read is named.
  auto dir = ReadFileToString(dir_);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("read(" + dir_ + ")"), std::string::npos) << dir.status();
  absl::Status no_parent = WriteFileContents(dir_ + "/none/f", "x");
  ASSERT_FALSE(no_parent.ok());
  EXPECT_NE(no_parent.message().find("open(" + dir_ + "/none/f)"), std::string::npos) << no_parent;
  EXPECT_NE(no_parent.message().find("(errno 2)"), std::string::npos) << no_parent;
}

}  // namespace
}  // namespace sbx
