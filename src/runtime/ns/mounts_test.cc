// Mount plan building and the parent's rendering of child failures (no root).
#include "runtime/ns/mounts.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/backend.h"
#include "runtime/ns/launcher.h"

namespace sbx::runtime::ns {
namespace {

TemplateSpec BaseTemplate() {
  TemplateSpec t;
  t.name = "base";
  t.rootfs_dir = "/var/lib/sbx/templates/base";
  t.binds = {{"/usr", "/usr", true}, {"/etc/hostname", "/etc/host/name", true}};
  return t;
}

TEST(MountPlan, BuildsPaths) {
  auto plan = BuildMountPlan(BaseTemplate(), "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->rootfs, "/var/lib/sbx/sandboxes/sbx_x/rootfs");
  EXPECT_EQ(plan->overlay_data,
            "lowerdir=/var/lib/sbx/templates/base,upperdir=/var/lib/sbx/sandboxes/sbx_x/upper,"
            "workdir=/var/lib/sbx/sandboxes/sbx_x/work,volatile");
  ASSERT_EQ(plan->binds.size(), 2u);
  EXPECT_TRUE(plan->binds[0].is_dir);
  EXPECT_EQ(plan->binds[0].target, plan->rootfs + "/usr");
  EXPECT_EQ(plan->binds[0].mkdirs, std::vector<std::string>{plan->rootfs + "/usr"});
  // A file bind: parents are created, the target itself becomes an empty file.
  EXPECT_FALSE(plan->binds[1].is_dir);
  EXPECT_EQ(plan->binds[1].mkdirs,
            (std::vector<std::string>{plan->rootfs + "/etc", plan->rootfs + "/etc/host"}));
  EXPECT_EQ(plan->binds[1].target, plan->rootfs + "/etc/host/name");
  EXPECT_EQ(plan->nodes.size(), 6u);
  EXPECT_FALSE(plan->masked.empty());
  EXPECT_FALSE(plan->read_only.empty());
}

TEST(MountPlan, RejectsBadInput) {
  TemplateSpec t = BaseTemplate();
  t.rootfs_dir = "relative/dir";
  EXPECT_FALSE(BuildMountPlan(t, "/s").ok());
  t.rootfs_dir = "/a,upperdir=/evil";
  EXPECT_FALSE(BuildMountPlan(t, "/s").ok());
  t = BaseTemplate();
  EXPECT_FALSE(BuildMountPlan(t, "/s:x").ok());
  for (const char* bad : {"/proc/x", "/dev", "/tmp/y", "/", "/usr/../etc", "rel", "/a/./b"}) {
    t = BaseTemplate();
    t.binds = {{"/usr", bad, true}};
    EXPECT_FALSE(BuildMountPlan(t, "/s").ok()) << bad;
  }
  t = BaseTemplate();
  t.binds = {{"/does/not/exist", "/x", true}};
  auto r = BuildMountPlan(t, "/s");
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/does/not/exist"), std::string::npos);
}

TEST(ChildFailure, NamesStepSyscallAndErrno) {
  LaunchPlan plan;
  auto mp = BuildMountPlan(BaseTemplate(), "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(mp.ok());
  plan.mounts = *mp;
  ChildReport r;
  r.step = static_cast<uint16_t>(Step::kMountOverlay);
  r.err = ENODEV;
  absl::Status s = DescribeChildFailure(plan, r);
  EXPECT_EQ(s.message().substr(0, 70),
            "mount overlay: mount(overlay -> /var/lib/sbx/sandboxes/sbx_x/rootfs, l");
  EXPECT_NE(s.message().find("No such device (errno 19)"), std::string::npos) << s;

  r.step = static_cast<uint16_t>(Step::kBindSetattr);
  r.index = 0;
  r.err = EPERM;
  s = DescribeChildFailure(plan, r);
  EXPECT_NE(s.message().find("bind /usr: mount_setattr(RDONLY|IDMAP"), std::string::npos) << s;
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);

  r.step = static_cast<uint16_t>(Step::kMaskDir);
  r.index = 0;
  r.err = EROFS;
  s = DescribeChildFailure(plan, r);
  EXPECT_NE(s.message().find("mask directory: mkdir(/var/lib/sbx/sandboxes/sbx_x/mask)"), std::string::npos) << s;

  r.step = static_cast<uint16_t>(Step::kBindMount);
  r.index = 7;  // out of range: still a message, never a crash
  EXPECT_FALSE(DescribeChildFailure(plan, r).ok());
}

TEST(MountPlan, ReadOnlyDirectoryViewsStackOnTheirCloneAtTheTarget) {
  TemplateSpec t = BaseTemplate();
  t.binds.push_back({"/usr", "/opt/a:b", true});
  t.binds.push_back({"/usr", "/srv/rw", false});
  MountOptions o;
  o.empty_dir = "/var/lib/sbx/view-empty";
  auto plan = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->binds.size(), 4u);
  const auto& usr = plan->binds[0];
  EXPECT_TRUE(usr.view);
  EXPECT_TRUE(usr.stage.empty());
  EXPECT_EQ(usr.view_overlay, "lowerdir=" + plan->rootfs + "/usr:/var/lib/sbx/view-empty");
  EXPECT_FALSE(plan->make_views_empty);
  // A ':' cannot be carried in lowerdir: that clone is staged in the sandbox directory.
  const auto& odd = plan->binds[2];
  EXPECT_TRUE(odd.view);
  EXPECT_EQ(odd.stage, "/var/lib/sbx/sandboxes/sbx_x/views/2");
  EXPECT_EQ(odd.view_overlay, "lowerdir=/var/lib/sbx/sandboxes/sbx_x/views/2:/var/lib/sbx/view-empty");
  EXPECT_EQ(plan->views_dir, "/var/lib/sbx/sandboxes/sbx_x/views");
  // Files and read-write directories are plain binds.
  EXPECT_FALSE(plan->binds[1].view);
  EXPECT_FALSE(plan->binds[3].view);
  EXPECT_TRUE(plan->binds[3].view_overlay.empty());

  // Without a shared empty directory the sandbox gets its own, made by the child.
  auto own = BuildMountPlan(BaseTemplate(), "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(own->make_views_empty);
  EXPECT_EQ(own->views_empty, "/var/lib/sbx/sandboxes/sbx_x/views/empty");
  EXPECT_EQ(own->binds[0].view_overlay,
            "lowerdir=" + own->rootfs + "/usr:/var/lib/sbx/sandboxes/sbx_x/views/empty");

  o.empty_dir = "/var/lib/x,y";
  EXPECT_FALSE(BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o).ok());
}

TEST(MountPlan, AnImageStacksItsLayersUnderTheSkeletonTopFirst) {
  TemplateSpec t;
  t.name = "py";
  t.rootfs_dir = "/var/lib/sbx/templates/skel";
  t.lower_dirs = {"/var/lib/sbx/templates/store/layers/sha256/bb",
                  "/var/lib/sbx/templates/store/layers/sha256/aa"};
  MountOptions o;
  o.uid_base = 589824;
  o.disk = true;
  auto plan = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->image_layers.size(), 2u);
  EXPECT_EQ(plan->image_layers[0].source, t.lower_dirs[0]);
  EXPECT_EQ(plan->image_layers[0].target, plan->rootfs + "/l0");
  EXPECT_EQ(plan->image_layers[1].target, plan->rootfs + "/l1");
  EXPECT_EQ(plan->overlay_data.rfind("lowerdir=" + plan->rootfs + "/lower:" + plan->rootfs +
                                         "/l0:" + plan->rootfs + "/l1,",
                                     0),
            0u)
      << plan->overlay_data;
  // Without a user namespace the overlay reads the layers where they are.
  auto plain = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->image_layers[0].target.empty());
  EXPECT_NE(plain->overlay_data.find(":" + t.lower_dirs[0] + ":" + t.lower_dirs[1] + ","),
            std::string::npos);
  // More layers than a page of mount options holds: refused with the count.
  for (int i = 0; i < 200; ++i) t.lower_dirs.push_back(t.lower_dirs[0]);
  auto many = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_FALSE(many.ok());
  EXPECT_NE(std::string(many.status().message()).find("202 layers"), std::string::npos)
      << many.status();
  // A layer path overlayfs' option syntax cannot carry is refused.
  t.lower_dirs = {"/var/lib/x:y"};
  EXPECT_FALSE(BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o).ok());
}

TEST(MountPlan, UserNamespaceIdmapsTheLowerAndOwnsTheTmpfsRoots) {
  MountOptions o;
  o.uid_base = 589824;
  o.tmp_bytes = 8u << 20;
  auto plan = BuildMountPlan(BaseTemplate(), "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->lower, "/var/lib/sbx/sandboxes/sbx_x/lower");
  EXPECT_EQ(plan->lower_source, "/var/lib/sbx/templates/base");
  EXPECT_EQ(plan->overlay_data.rfind("lowerdir=/var/lib/sbx/sandboxes/sbx_x/lower,", 0), 0u) << plan->overlay_data;
  EXPECT_EQ(plan->tmp_data, "mode=1777,size=8388608,uid=589824,gid=589824");
  EXPECT_NE(plan->devpts_data.find("gid=589829"), std::string::npos) << plan->devpts_data;

  // With a disk, the disk, the lower's directory on it and the overlay all stack on rootfs.
  o.disk = true;
  auto on_disk = BuildMountPlan(BaseTemplate(), "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(on_disk->disk, on_disk->rootfs);
  EXPECT_EQ(on_disk->lower, on_disk->rootfs + "/lower");
  EXPECT_TRUE(on_disk->make_lower);
  EXPECT_EQ(on_disk->overlay_data,
            "lowerdir=/var/lib/sbx/sandboxes/sbx_x/rootfs/lower,upperdir=/var/lib/sbx/sandboxes/sbx_x/rootfs/upper,"
            "workdir=/var/lib/sbx/sandboxes/sbx_x/rootfs/work,volatile");
  EXPECT_FALSE(plan->make_lower);

  auto plain = BuildMountPlan(BaseTemplate(), "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->lower.empty());
  EXPECT_EQ(plain->tmp_data.find("uid="), std::string::npos);
}

TEST(MountPlan, EmptyReadOnlyDirectoriesAreTheSandboxsOwnMaskNotAView) {
  char tmpl[] = "/tmp/sbx-mounts-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string empty = std::string(tmpl) + "/empty.d";
  const std::string full = std::string(tmpl) + "/full.d";
  ASSERT_EQ(::mkdir(empty.c_str(), 0555), 0);
  ASSERT_EQ(::mkdir(full.c_str(), 0755), 0);
  ASSERT_EQ(::close(::creat((full + "/f").c_str(), 0644)), 0);
  TemplateSpec t = BaseTemplate();
  t.binds = {{empty, "/etc/ssl/private", true}, {full, "/opt/full", true}, {empty, "/srv/rw", false}};
  MountOptions o;
  o.disk = true;
  auto plan = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // On the disk, under the overlay: the sandbox's own directory, never the host's or a shared one.
  EXPECT_EQ(plan->mask_dir, plan->rootfs + "/mask");
  EXPECT_TRUE(plan->binds[0].mask);
  EXPECT_FALSE(plan->binds[0].view);
  EXPECT_TRUE(plan->binds[0].view_overlay.empty());
  // A directory with entries is a view; a writable one a plain bind.
  EXPECT_FALSE(plan->binds[1].mask);
  EXPECT_TRUE(plan->binds[1].view);
  EXPECT_FALSE(plan->binds[2].mask);
  EXPECT_FALSE(plan->binds[2].view);
  auto plain = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->mask_dir, "/var/lib/sbx/sandboxes/sbx_x/mask");
  ::unlink((full + "/f").c_str());
  ::rmdir(full.c_str());
  ::rmdir(empty.c_str());
  ::rmdir(tmpl);
}

TEST(MountPlan, ViewsInOneMountShareOneOverlayOnTheDisk) {
  char tmpl[] = "/tmp/sbx-mounts-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string base = tmpl;
  for (const char* d : {"/a", "/a/x", "/b", "/b/y"}) ASSERT_EQ(::mkdir((base + d).c_str(), 0755), 0);
  TemplateSpec t = BaseTemplate();
  t.binds = {{base + "/a", "/usr", true}, {base + "/b", "/opt/b", true}, {base + "/a", "/srv/rw", false}};
  MountOptions o;
  o.disk = true;
  auto plan = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->shared_view_source, base);
  EXPECT_EQ(plan->shared_view, plan->rootfs + "/views");
  EXPECT_EQ(plan->shared_view_overlay, "lowerdir=" + plan->rootfs + "/views:" + plan->rootfs + "/mask");
  EXPECT_TRUE(plan->binds[0].shared);
  EXPECT_EQ(plan->binds[0].shared_rel, "a");
  EXPECT_EQ(plan->binds[0].shared_path, plan->rootfs + "/views/a");
  EXPECT_FALSE(plan->binds[0].view);
  EXPECT_TRUE(plan->binds[1].shared);
  EXPECT_EQ(plan->binds[1].shared_rel, "b");
  // A writable bind is never part of it.
  EXPECT_FALSE(plan->binds[2].shared);
  // Without a disk (no second lower on another file system), or with one view: separate views.
  auto plain = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->shared_view.empty());
  EXPECT_TRUE(plain->binds[0].view);
  t.binds.resize(1);
  auto one = BuildMountPlan(t, "/var/lib/sbx/sandboxes/sbx_x", o);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->shared_view.empty());
  EXPECT_TRUE(one->binds[0].view);
  for (const char* d : {"/a/x", "/a", "/b/y", "/b"}) ::rmdir((base + d).c_str());
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace sbx::runtime::ns
