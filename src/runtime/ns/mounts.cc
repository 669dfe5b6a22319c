#include "runtime/ns/mounts.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/backend.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

namespace {

// Characters overlayfs' option parser treats specially; refusing them keeps escaping out of it.
absl::Status CheckOverlayPath(const std::string& what, const std::string& p) {
  if (p.empty() || p[0] != '/') {
    return absl::InvalidArgumentError(fmt::format("{} must be an absolute path, got \"{}\"", what, p));
  }
  if (p.find_first_of(",:\\") != std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("{} \"{}\" contains ',', ':' or '\\', which overlayfs options cannot carry", what, p));
  }
  return absl::OkStatus();
}

// "/a/b/c" -> {"a","b","c"}; rejects relative paths, "." and ".." components.
absl::StatusOr<std::vector<std::string>> SandboxPathComponents(const std::string& p) {
  if (p.empty() || p[0] != '/') {
    return absl::InvalidArgumentError(fmt::format("template bind: sandbox path \"{}\" is not absolute", p));
  }
  std::vector<std::string> out;
  size_t pos = 1;
  while (pos <= p.size()) {
    size_t slash = p.find('/', pos);
    if (slash == std::string::npos) slash = p.size();
    std::string c = p.substr(pos, slash - pos);
    if (c == "." || c == "..") {
      return absl::InvalidArgumentError(
          fmt::format("template bind: sandbox path \"{}\" contains '.' or '..'", p));
    }
    if (!c.empty()) out.push_back(std::move(c));
    pos = slash + 1;
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("template bind: cannot bind over the sandbox's root");
  }
  const std::string& top = out[0];
  if (top == "proc" || top == "dev" || top == "tmp") {
    return absl::InvalidArgumentError(fmt::format(
        "template bind: sandbox path \"{}\" is under /{}, which the runtime mounts itself", p, top));
  }
  return out;
}

// A directory without entries (a template's secret mask, e.g. base's empty.d over
// /etc/ssl/private). st_nlink > 2 means subdirectories, so /usr and /etc cost no opendir.
bool IsEmptyDir(const std::string& path, const struct stat& st) {
  if (st.st_nlink > 2) return false;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return false;
  bool empty = true;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(d);
  return empty;
}

// The id of the mount `path` lies in (statx STATX_MNT_ID), or 0.
uint64_t MountIdOf(const std::string& path) {
  struct statx stx;
  if (::statx(AT_FDCWD, path.c_str(), AT_STATX_DONT_SYNC, STATX_MNT_ID, &stx) != 0) return 0;
  return (stx.stx_mask & STATX_MNT_ID) != 0 ? stx.stx_mnt_id : 0;
}

// The members of the shared view (MountPlan::shared_view): the largest set of at least two
// unstaged views whose canonical sources lie in one mount, together with their common
// ancestor, which must lie in that mount too (then no other mount sits between it and a
// source, since every mount has its own id).
void PlanSharedView(MountPlan& plan) {
  std::map<uint64_t, std::vector<size_t>> by_mount;
  for (size_t i = 0; i < plan.binds.size(); ++i) {
    const auto& b = plan.binds[i];
    if (!b.view || !b.stage.empty()) continue;
    char real[PATH_MAX];
    if (::realpath(b.source.c_str(), real) == nullptr || b.source != real) continue;
    uint64_t id = MountIdOf(b.source);
    if (id != 0) by_mount[id].push_back(i);
  }
  const std::vector<size_t>* best = nullptr;
  uint64_t best_id = 0;
  for (const auto& [id, members] : by_mount) {
    if (members.size() >= 2 && (best == nullptr || members.size() > best->size())) {
      best = &members;
      best_id = id;
    }
  }
  if (best == nullptr) return;
  std::string common = plan.binds[(*best)[0]].source;
  for (size_t i : *best) {
    const std::string& src = plan.binds[i].source;
    while (!(src == common || (src.compare(0, common.size(), common) == 0 &&
                               (common == "/" || src[common.size()] == '/')))) {
      size_t slash = common.rfind('/');
      common = slash == 0 ? "/" : common.substr(0, slash);
    }
  }
  if (MountIdOf(common) != best_id) return;
  plan.shared_view_source = common;
  plan.shared_view = plan.rootfs + "/views";
  plan.shared_view_overlay = fmt::format("lowerdir={}:{}", plan.shared_view, plan.mask_dir);
  for (size_t i : *best) {
    auto& b = plan.binds[i];
    b.shared = true;
    b.shared_rel = b.source.substr(common.size() + (common == "/" || b.source == common ? 0 : 1));
    if (!b.shared_rel.empty() && b.shared_rel[0] == '/') b.shared_rel.erase(0, 1);
    b.shared_path = b.shared_rel.empty() ? plan.shared_view : plan.shared_view + "/" + b.shared_rel;
    b.view = false;
    b.view_overlay.clear();
  }
}

}  // namespace

absl::Status ProbeOverlayfs(const std::string& proc_root) {
  const std::string path = fmt::format("{}/filesystems", proc_root);
  SBX_ASSIGN_OR_RETURN(std::string fs, ReadFileToString(path));
  if (fs.find("\toverlay\n") == std::string::npos) {
    return absl::FailedPreconditionError(fmt::format(
        "overlayfs is missing (no 'overlay' in {}): build it into the kernel "
        "(CONFIG_OVERLAY_FS) or load the overlay module", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<MountPlan> BuildMountPlan(const TemplateSpec& tmpl, const std::string& sandbox_dir,
                                         const MountOptions& o) {
  SBX_RETURN_IF_ERROR(CheckOverlayPath("template rootfs_dir", tmpl.rootfs_dir));
  SBX_RETURN_IF_ERROR(CheckOverlayPath("sandbox directory", sandbox_dir));
  if (!o.empty_dir.empty()) SBX_RETURN_IF_ERROR(CheckOverlayPath("empty directory", o.empty_dir));
  MountPlan plan;
  plan.rootfs = sandbox_dir + "/rootfs";
  plan.uid_base = o.uid_base;
  // With a disk, everything stacks on `rootfs`, the only mount point on the host's file
  // system: the disk, the idmapped lower on a directory of the disk, and the overlay on top of
  // both. Every directory made on the state dir's file system costs a create its inode
  // allocation (0.3-0.5 ms of CPU each on the project's fragmented ext4, docs/isolation.md §7).
  const std::string layers = o.disk ? plan.rootfs : sandbox_dir;
  if (o.disk) plan.disk = layers;
  plan.mask_dir = layers + "/mask";
  std::string lowerdir = tmpl.rootfs_dir;
  if (o.uid_base != 0) {
    plan.lower_source = tmpl.rootfs_dir;
    plan.lower = (o.disk ? layers : sandbox_dir) + "/lower";
    plan.make_lower = o.disk;
    lowerdir = plan.lower;
  }
  // An image's layers under the skeleton (rootfs_dir), top first, as overlayfs reads them:
  // its whiteouts (0/0 character devices) and opaque directories (trusted.overlay.opaque; the
  // overlay is mounted by the child while it is still host root in the initial user
  // namespace, so trusted.* xattrs count) hide what the layers below hold.
  for (size_t i = 0; i < tmpl.lower_dirs.size(); ++i) {
    const std::string& dir = tmpl.lower_dirs[i];
    SBX_RETURN_IF_ERROR(CheckOverlayPath(fmt::format("template {} layer {}", tmpl.name, i), dir));
    MountPlan::Layer layer;
    layer.source = dir;
    if (o.uid_base != 0) layer.target = fmt::format("{}/l{}", o.disk ? layers : sandbox_dir, i);
    lowerdir += ":" + (layer.target.empty() ? dir : layer.target);
    plan.image_layers.push_back(std::move(layer));
  }
  // volatile: upper and work are thrown away with the sandbox, so the syncfs of the whole
  // upper file system that overlayfs otherwise does on every sync and unmount is pure cost.
  plan.overlay_data = fmt::format("lowerdir={},upperdir={}/upper,workdir={}/work,volatile",
                                  lowerdir, layers, layers);
  if (plan.overlay_data.size() >= 4000) {
    return absl::InvalidArgumentError(fmt::format(
        "mount overlay: the option string of template {} ({} layers) is longer than a page: "
        "the kernel takes at most 4096 bytes of mount options",
        tmpl.name, tmpl.lower_dirs.size()));
  }

  for (const BindMount& b : tmpl.binds) {
    if (b.host_path.empty() || b.host_path[0] != '/') {
      return absl::InvalidArgumentError(
          fmt::format("template bind: host path \"{}\" is not absolute", b.host_path));
    }
    SBX_ASSIGN_OR_RETURN(std::vector<std::string> comps, SandboxPathComponents(b.sandbox_path));
    struct stat st;
    if (::stat(b.host_path.c_str(), &st) != 0) {
      return ErrnoStatus(errno, fmt::format("template bind: stat({})", b.host_path));
    }
    MountPlan::Bind bind;
    bind.source = b.host_path;
    bind.sandbox_path = b.sandbox_path;
    bind.is_dir = S_ISDIR(st.st_mode);
    bind.read_only = b.read_only;
    std::string cur = plan.rootfs;
    for (size_t i = 0; i < comps.size(); ++i) {
      cur += "/" + comps[i];
      if (i + 1 < comps.size() || bind.is_dir) bind.mkdirs.push_back(cur);
    }
    bind.target = cur;
    // An empty read-only directory shows the same as the sandbox's own mask directory, without
    // a view overlay (a superblock) of its own.
    if (bind.is_dir && bind.read_only && IsEmptyDir(b.host_path, st)) {
      bind.mask = true;
    } else if (bind.is_dir && bind.read_only) {
      bind.view = true;
      if (plan.views_empty.empty()) {
        plan.make_views_empty = o.empty_dir.empty();
        plan.views_empty = plan.make_views_empty ? sandbox_dir + "/views/empty" : o.empty_dir;
        if (plan.make_views_empty) plan.views_dir = sandbox_dir + "/views";
      }
      // The clone sits at the target and the overlay on top, unless the target's path holds a
      // character of overlayfs' option syntax: then it is staged under <dir>/views.
      if (!CheckOverlayPath("bind target", bind.target).ok()) {
        plan.views_dir = sandbox_dir + "/views";
        bind.stage = fmt::format("{}/{}", plan.views_dir, plan.binds.size());
      }
      bind.view_overlay = fmt::format("lowerdir={}:{}", bind.stage.empty() ? bind.target : bind.stage,
                                      plan.views_empty);
      if (bind.view_overlay.size() >= 4000) {
        return absl::InvalidArgumentError(
            fmt::format("template bind {}: overlay option string longer than a page", b.sandbox_path));
      }
    }
    plan.binds.push_back(std::move(bind));
  }

  if (o.disk) PlanSharedView(plan);

  plan.proc = plan.rootfs + "/proc";
  plan.dev = plan.rootfs + "/dev";
  plan.tmp = plan.rootfs + "/tmp";
  plan.dev_pts = plan.dev + "/pts";
  plan.dev_shm = plan.dev + "/shm";
  plan.dev_null = plan.dev + "/null";
  // tmpfs and devpts take their owners in the mounter's (the host's) ids: with a user namespace
  // the roots belong to the sandbox's root, as they would on a normal machine.
  const std::string owner =
      o.uid_base != 0 ? fmt::format(",uid={},gid={}", o.uid_base, o.uid_base) : std::string();
  plan.dev_data = fmt::format("mode=755,size={}{}", kDevSizeBytes, owner);
  plan.tmp_data = fmt::format("mode=1777,size={}{}", o.tmp_bytes, owner);
  plan.shm_data = fmt::format("mode=1777,size={}{}", o.shm_bytes, owner);
  // gid 5 is "tty" on Debian-family templates; a missing group only affects `ls -l`. New
  // terminals belong to sandbox root rather than to whoever opens /dev/ptmx: that is the agent,
  // whose uid is not mapped inside (userns.h), and a terminal owned by "nobody" upsets programs
  // that check who owns their tty.
  plan.devpts_data = o.uid_base != 0
                         ? fmt::format("newinstance,ptmxmode=0666,mode=0620,uid={},gid={}", o.uid_base, o.uid_base + 5)
                         : std::string("newinstance,ptmxmode=0666,mode=0620,gid=5");

  const struct {
    const char* name;
    unsigned major, minor;
  } nodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
               {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
  for (const auto& n : nodes) {
    plan.nodes.push_back({plan.dev + "/" + n.name, S_IFCHR | 0666, makedev(n.major, n.minor)});
  }
  const struct {
    const char* target;
    const char* name;
  } links[] = {{"/proc/self/fd", "fd"},
               {"/proc/self/fd/0", "stdin"},
               {"/proc/self/fd/1", "stdout"},
               {"/proc/self/fd/2", "stderr"},
               {"pts/ptmx", "ptmx"}};
  for (const auto& l : links) plan.links.push_back({l.target, plan.dev + "/" + l.name});

  // Docker's masked and read-only /proc paths. In a user namespace these files are host root's
  // and closed to sandbox root already; the masks still hide what is readable (sched_debug,
  // timer_list: host-wide scheduling and timer data), and they are the whole defence with
  // --userns=false, where sandbox root is uid 0 and the file modes alone would let it write
  // /proc/sysrq-trigger or /proc/sys/kernel/core_pattern (code execution on the host).
  for (const char* p : {"asound", "acpi", "kcore", "keys", "latency_stats", "timer_list",
                        "timer_stats", "sched_debug", "scsi"}) {
    plan.masked.push_back(plan.proc + "/" + p);
  }
  for (const char* p : {"bus", "fs", "irq", "sys", "sysrq-trigger"}) {
    plan.read_only.push_back(plan.proc + "/" + p);
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Child side: syscalls only, no allocation, no logging.

namespace {

inline int Fail(ChildReport* r, Step step, size_t index = 0) {
  r->step = static_cast<uint16_t>(step);
  r->index = static_cast<uint16_t>(index);
  r->err = errno;
  return r->err == 0 ? EIO : r->err;
}

inline void MarkMount(const MountPlan& p, MountTraceSlot slot) {
  if (p.trace == nullptr) return;
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  p.trace[kMountTraceFirst + slot] =
      static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

inline bool MkdirOk(const char* path, mode_t mode) {
  return ::mkdir(path, mode) == 0 || errno == EEXIST;
}

// Attaches a clone of `source` at `target` with `attrs` (MOUNT_ATTR_*), idmapped into
// `userns_fd` when that is >= 0. A file system that cannot be idmapped (EINVAL) is attached
// plain when `idmap_optional`. Returns 0, or -1 with errno set and *stage = 0 open_tree,
// 1 mount_setattr, 2 move_mount.
// `source` may be "" to clone the directory `dirfd` (an O_PATH fd) names.
int AttachClone(int dirfd, const char* source, const char* target, uint64_t attrs, int userns_fd,
                bool idmap_optional, int* stage) {
  *stage = 0;
  const unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (source[0] == '\0' ? AT_EMPTY_PATH : 0);
  int fd = static_cast<int>(::syscall(SYS_open_tree, dirfd, source, flags));
  if (fd < 0) return -1;
  struct mount_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.attr_set = attrs;
  if (userns_fd >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
  }
  *stage = 1;
  int rc = static_cast<int>(::syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)));
  if (rc != 0 && userns_fd >= 0 && idmap_optional && errno == EINVAL) {
    attr.attr_set &= ~static_cast<uint64_t>(MOUNT_ATTR_IDMAP);
    attr.userns_fd = 0;
    rc = static_cast<int>(::syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)));
  }
  if (rc == 0) {
    *stage = 2;
    rc = static_cast<int>(::syscall(SYS_move_mount, fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH));
  }
  int err = errno;
  ::close(fd);
  errno = err;
  return rc;
}

// The shared view's clone and overlay at p.shared_view, held as *view_fd (O_PATH): the root
// overlay covers p.shared_view next, and the members are cloned from the fd after it.
int MountSharedView(const MountPlan& p, int userns_fd, int* view_fd, ChildReport* r) {
  size_t first = 0;
  while (first < p.binds.size() && !p.binds[first].shared) ++first;
  int stage = 0;
  if (!MkdirOk(p.shared_view.c_str(), 0755)) return Fail(r, Step::kBindMkdir, first);
  if (AttachClone(AT_FDCWD, p.shared_view_source.c_str(), p.shared_view.c_str(),
                  MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, userns_fd,
                  /*idmap_optional=*/true, &stage) != 0) {
    return Fail(r, stage == 0 ? Step::kBindMount : stage == 1 ? Step::kBindSetattr : Step::kBindMove, first);
  }
  if (::mount("overlay", p.shared_view.c_str(), "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
              p.shared_view_overlay.c_str()) != 0) {
    return Fail(r, Step::kBindView, first);
  }
  *view_fd = ::open(p.shared_view.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (*view_fd < 0) return Fail(r, Step::kBindMount, first);
  return 0;
}

// Root made private, the disk, the idmapped lower, the mask directory (opened as *mask_fd
// before the overlay covers it) and the overlay root on top.
int MountRoot(const MountPlan& p, int userns_fd, int disk_fd, int* mask_fd, int* view_fd, ChildReport* r) {
  if (::mount("", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return Fail(r, Step::kMakeRootPrivate);
  // The disk joins this namespace only: the host never sees it mounted, and it goes (with its
  // loop device) when the sandbox's last process does.
  if (disk_fd >= 0 &&
      ::syscall(SYS_move_mount, disk_fd, "", AT_FDCWD, p.disk.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    return Fail(r, Step::kMountDisk);
  }
  MarkMount(p, kMtDisk);
  if (p.make_lower && !MkdirOk(p.lower.c_str(), 0755)) return Fail(r, Step::kIdmapLower, 3);
  if (!p.lower.empty()) {
    // The overlay's copy-up keeps the lower's owners as seen through this mount: host root's
    // files become the sandbox root's, so sandbox root can change its /etc, /root, ...
    int stage = 0;
    if (AttachClone(AT_FDCWD, p.lower_source.c_str(), p.lower.c_str(),
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, userns_fd,
                    /*idmap_optional=*/false, &stage) != 0) {
      return Fail(r, Step::kIdmapLower, static_cast<size_t>(stage));
    }
  }
  for (size_t i = 0; i < p.image_layers.size(); ++i) {
    const MountPlan::Layer& l = p.image_layers[i];
    if (l.target.empty()) continue;
    if (!MkdirOk(l.target.c_str(), 0755)) return Fail(r, Step::kImageLayer, 4 * i + 3);
    // nosuid as for the template rootfs: a setuid file of an image is an ordinary file here.
    int stage = 0;
    if (AttachClone(AT_FDCWD, l.source.c_str(), l.target.c_str(),
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, userns_fd,
                    /*idmap_optional=*/false, &stage) != 0) {
      return Fail(r, Step::kImageLayer, 4 * i + static_cast<size_t>(stage));
    }
  }
  MarkMount(p, kMtLower);
  if (!MkdirOk(p.mask_dir.c_str(), 0555)) return Fail(r, Step::kMaskDir, 0);
  *mask_fd = ::open(p.mask_dir.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (*mask_fd < 0) return Fail(r, Step::kMaskDir, 1);
  if (!p.shared_view.empty()) {
    if (int err = MountSharedView(p, userns_fd, view_fd, r); err != 0) return err;
  }
  if (::mount("overlay", p.rootfs.c_str(), "overlay", MS_NOSUID | MS_NODEV, p.overlay_data.c_str()) != 0) {
    return Fail(r, Step::kMountOverlay);
  }
  MarkMount(p, kMtOverlay);
  return 0;
}

// A read-only, nosuid, nodev, noexec clone of the mask directory at `target` (idmapped, so
// that it shows as sandbox root's like the view it replaces).
inline int AttachMask(int mask_fd, const char* target, int userns_fd, int* stage) {
  return AttachClone(mask_fd, "", target,
                     MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                     userns_fd, /*idmap_optional=*/true, stage);
}

// Bind `i` of the plan: its mount point, then the (idmapped) clone, or a read-only overlay view
// of the clone staged under views_dir.
int MountBind(const MountPlan& p, size_t i, int userns_fd, int mask_fd, int view_fd, ChildReport* r) {
  const auto& b = p.binds[i];
  for (const auto& d : b.mkdirs) {
    if (!MkdirOk(d.c_str(), 0755)) return Fail(r, Step::kBindMkdir, i);
  }
  if (!b.is_dir) {
    // The mount point may already exist inside an earlier read-only bind (a mask over
    // /etc/shadow inside the /etc view): opening it for writing would fail with EROFS.
    int fd = ::open(b.target.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      fd = ::open(b.target.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    }
    if (fd < 0) return Fail(r, Step::kBindMkdir, i);
    ::close(fd);
  }
  int stage = 0;
  if (b.shared) {
    // A clone of the overlay's mount: read-only, nosuid, nodev like it; the files below are
    // idmapped through its lower.
    const unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (b.shared_rel.empty() ? AT_EMPTY_PATH : 0);
    int fd = static_cast<int>(::syscall(SYS_open_tree, view_fd, b.shared_rel.c_str(), flags));
    if (fd < 0) return Fail(r, Step::kBindMount, i);
    int rc = static_cast<int>(
        ::syscall(SYS_move_mount, fd, "", AT_FDCWD, b.target.c_str(), MOVE_MOUNT_F_EMPTY_PATH));
    int err = errno;
    ::close(fd);
    errno = err;
    return rc == 0 ? 0 : Fail(r, Step::kBindMove, i);
  }
  if (b.mask) {
    if (AttachMask(mask_fd, b.target.c_str(), userns_fd, &stage) != 0) {
      return Fail(r, stage == 0 ? Step::kBindMount : stage == 1 ? Step::kBindSetattr : Step::kBindMove, i);
    }
    return 0;
  }
  const uint64_t attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (b.read_only ? MOUNT_ATTR_RDONLY : 0);
  if (b.view && p.make_views_empty &&
      (!MkdirOk(p.views_dir.c_str(), 0755) || !MkdirOk(p.views_empty.c_str(), 0755))) {
    return Fail(r, Step::kBindMkdir, i);
  }
  const bool staged = !b.stage.empty();
  if (staged && (!MkdirOk(p.views_dir.c_str(), 0755) || !MkdirOk(b.stage.c_str(), 0755))) {
    return Fail(r, Step::kBindMkdir, i);
  }
  if (AttachClone(AT_FDCWD, b.source.c_str(), staged ? b.stage.c_str() : b.target.c_str(), attrs, userns_fd,
                  /*idmap_optional=*/true, &stage) != 0) {
    return Fail(r, stage == 0 ? Step::kBindMount : stage == 1 ? Step::kBindSetattr : Step::kBindMove, i);
  }
  // On the clone just attached at the target (lowerdir names the target, which resolves to
  // the clone; the overlay then covers it).
  if (b.view && ::mount("overlay", b.target.c_str(), "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                        b.view_overlay.c_str()) != 0) {
    return Fail(r, Step::kBindView, i);
  }
  return 0;
}

// The /dev tmpfs with its nodes and links, devpts and /dev/shm.
int MountDev(const MountPlan& p, ChildReport* r) {
  if (::mount("tmpfs", p.dev.c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC, p.dev_data.c_str()) != 0) {
    return Fail(r, Step::kMountDev);
  }
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (::mknod(p.nodes[i].path.c_str(), p.nodes[i].mode, p.nodes[i].rdev) != 0) {
      return Fail(r, Step::kMknod, i);
    }
    // Cosmetic (the modes are 0666): `ls -l /dev` inside shows root, not nobody.
    if (p.uid_base != 0 && ::lchown(p.nodes[i].path.c_str(), p.uid_base, p.uid_base) != 0) {
      return Fail(r, Step::kMknod, i);
    }
  }
  for (size_t i = 0; i < p.links.size(); ++i) {
    if (::symlink(p.links[i].target.c_str(), p.links[i].path.c_str()) != 0) return Fail(r, Step::kSymlink, i);
  }
  if (!MkdirOk(p.dev_pts.c_str(), 0755) ||
      ::mount("devpts", p.dev_pts.c_str(), "devpts", MS_NOSUID | MS_NOEXEC, p.devpts_data.c_str()) != 0) {
    return Fail(r, Step::kMountDevpts);
  }
  if (!MkdirOk(p.dev_shm.c_str(), 01777) ||
      ::mount("shm", p.dev_shm.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, p.shm_data.c_str()) != 0) {
    return Fail(r, Step::kMountShm);
  }
  return 0;
}

// The masked /proc paths (the mask directory over directories, /dev/null over files) and the
// read-only ones; paths this kernel lacks are skipped.
int MaskProc(const MountPlan& p, int userns_fd, int mask_fd, ChildReport* r) {
  for (size_t i = 0; i < p.masked.size(); ++i) {
    struct stat st;
    if (::stat(p.masked[i].c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      return Fail(r, Step::kMaskProc, i);
    }
    int stage = 0;
    int rc = S_ISDIR(st.st_mode)
                 ? AttachMask(mask_fd, p.masked[i].c_str(), userns_fd, &stage)
                 : ::mount(p.dev_null.c_str(), p.masked[i].c_str(), nullptr, MS_BIND, nullptr);
    if (rc != 0) return Fail(r, Step::kMaskProc, i);
  }
  for (size_t i = 0; i < p.read_only.size(); ++i) {
    const char* path = p.read_only[i].c_str();
    if (::mount(path, path, nullptr, MS_BIND, nullptr) != 0) {
      if (errno == ENOENT) continue;
      return Fail(r, Step::kReadonlyProc, i);
    }
    if (::mount(nullptr, path, nullptr,
                MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
      return Fail(r, Step::kReadonlyProc, i);
    }
  }
  return 0;
}

}  // namespace

namespace {

int SetupMountsWithFds(const MountPlan& p, int userns_fd, int disk_fd, int* mask_fd, int* view_fd,
                       ChildReport* r) {
  if (int err = MountRoot(p, userns_fd, disk_fd, mask_fd, view_fd, r); err != 0) return err;
  for (size_t i = 0; i < p.binds.size(); ++i) {
    if (int err = MountBind(p, i, userns_fd, *mask_fd, *view_fd, r); err != 0) return err;
  }
  MarkMount(p, kMtBinds);
  if (!MkdirOk(p.proc.c_str(), 0555)) return Fail(r, Step::kMkdirMountpoint, 0);
  if (!MkdirOk(p.dev.c_str(), 0755)) return Fail(r, Step::kMkdirMountpoint, 1);
  if (!MkdirOk(p.tmp.c_str(), 01777)) return Fail(r, Step::kMkdirMountpoint, 2);
  // This proc instance belongs to the new pid namespace: the sandbox sees only its processes.
  if (::mount("proc", p.proc.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    return Fail(r, Step::kMountProc);
  }
  MarkMount(p, kMtProc);
  if (int err = MountDev(p, r); err != 0) return err;
  MarkMount(p, kMtDev);
  if (int err = MaskProc(p, userns_fd, *mask_fd, r); err != 0) return err;
  MarkMount(p, kMtMasks);
  if (::mount("tmpfs", p.tmp.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, p.tmp_data.c_str()) != 0) {
    return Fail(r, Step::kMountTmp);
  }
  MarkMount(p, kMtTmp);
  return 0;
}

}  // namespace

int SetupMounts(const MountPlan& p, int userns_fd, int disk_fd, ChildReport* r) {
  int mask_fd = -1;
  int view_fd = -1;
  int err = SetupMountsWithFds(p, userns_fd, disk_fd, &mask_fd, &view_fd, r);
  if (mask_fd >= 0) ::close(mask_fd);
  if (view_fd >= 0) ::close(view_fd);
  return err;
}

int PivotRoot(const MountPlan& p, ChildReport* r) {
  if (::chdir(p.rootfs.c_str()) != 0) return Fail(r, Step::kChdirRootfs);
  // pivot_root(".", "."): the old root ends up stacked under the new one at "/", from where a
  // lazy unmount removes it without needing a directory to park it in.
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return Fail(r, Step::kPivotRoot);
  return 0;
}

int DetachOldRoot(ChildReport* r) {
  if (::umount2(".", MNT_DETACH) != 0) return Fail(r, Step::kDetachOldRoot);
  return 0;
}

}  // namespace sbx::runtime::ns
