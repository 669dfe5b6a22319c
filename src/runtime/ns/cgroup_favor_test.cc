#include "runtime/ns/cgroup_favor.h"

#include <sys/mount.h>

#include <gtest/gtest.h>

namespace sbx::runtime::ns {
namespace {

constexpr char kHybrid[] =
    "25 1 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 "
    "cgroup2 rw,nsdelegate\n"
    "27 25 0:25 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n";

TEST(CgroupFavor, FindsTheCgroup2MountAndKeepsEveryOption) {
  auto m = FindCgroup2Mount(kHybrid);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->mount_point, "/sys/fs/cgroup/unified");
  EXPECT_EQ(m->super_opts, "rw,nsdelegate");
  RemountArgs a = FavorDynmodsRemountArgs(*m);
  EXPECT_EQ(a.flags, static_cast<unsigned long>(MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME));
  EXPECT_EQ(a.data, "nsdelegate,favordynmods");
}

TEST(CgroupFavor, EscapedMountPointAndNoSuperOptions) {
  auto m = FindCgroup2Mount("30 1 0:30 / /a\\040b rw,relatime - cgroup2 none rw\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->mount_point, "/a b");
  EXPECT_EQ(FavorDynmodsRemountArgs(*m).data, "favordynmods");
}

TEST(CgroupFavor, NoCgroup2IsNotFoundAndJunkIsIgnored) {
  EXPECT_TRUE(absl::IsNotFound(FindCgroup2Mount("").status()));
  EXPECT_TRUE(absl::IsNotFound(FindCgroup2Mount("garbage\n1 2 3\n- cgroup2\n").status()));
  EXPECT_TRUE(HasOption("rw,favordynmods", "favordynmods"));
  EXPECT_FALSE(HasOption("rw,favordynmodsx", "favordynmods"));
}

}  // namespace
}  // namespace sbx::runtime::ns
