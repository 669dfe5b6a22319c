#include "runtime/ns/fsutil.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace sbx::runtime::ns {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/sbx-fsutil-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "";
}

bool Exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

void Touch(const std::string& p) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << p;
  ::close(fd);
}

TEST(RemoveTree, DeepTreeWithUnreadableDirsAndSymlinks) {
  const std::string base = TempDir();
  ASSERT_FALSE(base.empty());
  const std::string outside = base + "/outside";
  Touch(outside);
  const std::string tree = base + "/tree";
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  // Deeper than the number of directories RemoveTree keeps open, with files at every level.
  std::string cur = tree;
  for (int i = 0; i < 100; ++i) {
    cur += "/d";
    ASSERT_EQ(::mkdir(cur.c_str(), 0755), 0);
    Touch(cur + "/f");
    if (i % 10 == 0) {
      ASSERT_EQ(::mkdir((cur + "/wide").c_str(), 0755), 0);
      for (int j = 0; j < 20; ++j) Touch(cur + "/wide/" + std::to_string(j));
    }
  }
  // A symlink out of the tree must be removed, not followed.
  ASSERT_EQ(::symlink(outside.c_str(), (tree + "/link").c_str()), 0);
  ASSERT_EQ(::symlink(base.c_str(), (tree + "/dirlink").c_str()), 0);
  // overlayfs leaves work/work with mode 000.
  ASSERT_EQ(::mkdir((tree + "/work").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tree + "/work/work").c_str(), 0755), 0);
  Touch(tree + "/work/work/x");
  ASSERT_EQ(::chmod((tree + "/work/work").c_str(), 0), 0);

  absl::Status s = RemoveTree(tree);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE(Exists(tree));
  EXPECT_TRUE(Exists(outside));
  EXPECT_TRUE(RemoveTree(tree).ok());  // already gone: fine
  EXPECT_TRUE(RemoveTree(base).ok());
  EXPECT_FALSE(Exists(base));
}

TEST(RemoveTree, PlainFileAndRefusesRoot) {
  const std::string base = TempDir();
  Touch(base + "/f");
  EXPECT_TRUE(RemoveTree(base + "/f").ok());
  EXPECT_FALSE(Exists(base + "/f"));
  EXPECT_FALSE(RemoveTree("/").ok());
  EXPECT_TRUE(RemoveTree(base).ok());
}

TEST(FsUtil, MkdirAllAndFiles) {
  const std::string base = TempDir();
  ASSERT_TRUE(MkdirAll(base + "/a/b/c", 0755).ok());
  ASSERT_TRUE(MkdirAll(base + "/a/b/c", 0755).ok());
  ASSERT_TRUE(WriteStringToFile(base + "/a/f", "hello", true).ok());
  EXPECT_FALSE(MkdirAll(base + "/a/f/g", 0755).ok());
  auto r = ReadFileToString(base + "/a/f");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "hello");
  EXPECT_TRUE(absl::IsNotFound(ReadFileToString(base + "/nope").status()));
  auto names = ListDir(base + "/a");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 2u);
  EXPECT_TRUE(RemoveTree(base).ok());
}

TEST(FsUtil, MakeEmptyDirRefusesAnythingButAnEmptyDirectory) {
  const std::string d = TempDir();
  ASSERT_FALSE(d.empty());
  const std::string e = d + "/empty";
  ASSERT_TRUE(MakeEmptyDir(e, 0555).ok());
  struct stat st;
  ASSERT_EQ(::stat(e.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  EXPECT_TRUE(MakeEmptyDir(e, 0555).ok());  // again: fine
  ASSERT_EQ(::chmod(e.c_str(), 0755), 0);
  Touch(e + "/x");
  EXPECT_EQ(MakeEmptyDir(e, 0555).code(), absl::StatusCode::kFailedPrecondition);
  Touch(d + "/file");
  EXPECT_EQ(MakeEmptyDir(d + "/file", 0555).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(::symlink(e.c_str(), (d + "/link").c_str()), 0);
  EXPECT_EQ(MakeEmptyDir(d + "/link", 0555).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(RemoveTree(d).ok());
}

TEST(FsUtil, StartTimeAndPidList) {
  auto st = ProcessStartTime(::getpid());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_GT(*st, 0u);
  auto again = ProcessStartTime(::getpid());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*st, *again);
  EXPECT_TRUE(absl::IsNotFound(ProcessStartTime(0x7ffffff0).status()));
  EXPECT_EQ(ParsePidList("12\n34\n\n"), (std::vector<pid_t>{12, 34}));
  EXPECT_TRUE(ParsePidList("").empty());
}

}  // namespace
}  // namespace sbx::runtime::ns
