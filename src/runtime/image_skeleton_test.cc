#include "runtime/image_skeleton.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include <gtest/gtest.h>

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;

TEST(ImageSkeleton, HoldsTheMountPointsOnlyAndIsIdempotent) {
  char t[] = "/tmp/sbx-skel-test-XXXXXX";
  ASSERT_NE(::mkdtemp(t), nullptr);
  const std::string dir = std::string(t) + "/skel";
  const mode_t old = ::umask(077);  // the modes must not depend on sbxd's umask
  ASSERT_TRUE(EnsureImageSkeleton(dir).ok());
  ASSERT_TRUE(EnsureImageSkeleton(dir).ok());
  ::umask(old);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"dev", "etc", "proc", "run", "sys", "tmp"}));
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/tmp").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  ASSERT_EQ(::stat((dir + "/etc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  // A file where a mount point belongs is an error naming it, not a silent success.
  fs::remove(dir + "/run");
  { FILE* f = std::fopen((dir + "/run").c_str(), "w"); std::fclose(f); }
  auto st2 = EnsureImageSkeleton(dir);
  EXPECT_FALSE(st2.ok());
  fs::remove_all(t);
}

}  // namespace
}  // namespace sbx::runtime
