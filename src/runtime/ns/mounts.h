// The sandbox's file system, built in the child inside its new mount namespace:
//   / private (nothing propagates back to the host) -> the template's rootfs, idmapped into the
//   sandbox's user namespace, at <dir>/lower -> the sandbox's empty mask directory, held open ->
//   the shared view (one overlay for the views whose sources share a mount), held open ->
//   overlay rootfs (lower = that, upper/work in the sandbox dir) -> template binds (idmapped,
//   read-only, nosuid, nodev) -> /proc -> tmpfs /dev with a fixed set of nodes, devpts, /dev/shm
//   -> /proc masks -> tmpfs /tmp -> pivot_root into the overlay and detach the old root.
//
// The parent builds a MountPlan (every path and option string); the child only reads it, so
// nothing allocates between clone and exec.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/ns/child_report.h"

namespace sbx::runtime {
struct TemplateSpec;
}

namespace sbx::runtime::ns {

// Sizes of the sandbox's tmpfs mounts (charged to the sandbox's memory cgroup).
inline constexpr size_t kTmpSizeBytes = 256u << 20;
inline constexpr size_t kShmSizeBytes = 64u << 20;
inline constexpr size_t kDevSizeBytes = 64u << 10;

// Sub-steps of SetupMounts in the launch trace (after the launcher's own slots).
inline constexpr int kMountTraceFirst = 16;
enum MountTraceSlot : int { kMtDisk = 0, kMtLower, kMtOverlay, kMtBinds, kMtProc, kMtDev, kMtMasks, kMtTmp, kMtSlots };

struct MountOptions {
  // Host uid/gid that the sandbox's root maps to; 0 = no user namespace (tests of the mount
  // code alone): nothing is idmapped and the tmpfs roots stay owned by host root.
  uint32_t uid_base = 0;
  size_t tmp_bytes = kTmpSizeBytes;
  size_t shm_bytes = kShmSizeBytes;
  // The overlay's upper and work live on the sandbox's own disk (disk_image.h), attached by the
  // child at <dir>/disk; false keeps them as plain directories of the sandbox dir (tests).
  bool disk = false;
  // An empty directory shared by every sandbox, the second lower of each read-only view
  // (overlay needs two lowers without an upper). Empty: <dir>/views/empty, made by the child.
  std::string empty_dir;
};

struct MountPlan {
  std::string rootfs;        // <dir>/rootfs, the overlay mount point (host path)
  std::string overlay_data;  // lowerdir=...,upperdir=...,workdir=...
  // With a user namespace: the template's rootfs is cloned (open_tree), idmapped into the
  // sandbox's namespace and attached at `lower`, which is the overlay's lowerdir; without one
  // both are empty and the overlay reads the template directory directly.
  std::string lower_source;
  std::string lower;
  bool make_lower = false;  // `lower` is a directory of the disk, made by the child
  // An image template's layers (TemplateSpec::lower_dirs, top first), each attached as `lower`
  // is (an idmapped, read-only, nosuid, nodev clone) at <layers>/l<i>, and listed after it in
  // the overlay's lowerdir; without a user namespace the overlay reads them directly (`target`
  // empty). Short names: the option string holds them all and must fit in a page.
  struct Layer {
    std::string source;  // the layer's tree in the template store
    std::string target;  // <layers>/l<i>, or "" without a user namespace
  };
  std::vector<Layer> image_layers;
  uint32_t uid_base = 0;
  // Optional profiling page (LaunchPlan::trace): SetupMounts stamps its sub-steps at
  // kMountTraceFirst + MountTraceSlot.
  uint64_t* trace = nullptr;
  // Mount point of the sandbox's disk (the child move_mount()s LaunchPlan::disk_fd there):
  // `rootfs` itself, which the overlay then covers; empty without one.
  std::string disk;
  // The sandbox's own empty directory (<rootfs>/mask on the disk, under the overlay, or
  // <dir>/mask without one), made 0555 by the child and cloned read-only, nosuid, nodev,
  // noexec (idmapped) over every masked directory: the /proc masks and a template's read-only
  // bind of an empty directory. Every superblock on the host costs each memory cgroup a slot in
  // the kernel's shrinker maps (memcgs x superblocks, docs/isolation.md §7): a tmpfs or view
  // overlay per mask was one more per sandbox. Not a shared host directory: an inotify watch on
  // it would see other sandboxes list their masks.
  std::string mask_dir;

  // Binds are attached as clones (open_tree + mount_setattr + move_mount), idmapped when there
  // is a user namespace so that host root's files show as the sandbox root's; a file system
  // that cannot be idmapped is attached plain (its files then show as nobody).
  //
  // A read-only directory bind is not what the sandbox sees: a read-only overlay of its clone is
  // mounted on top of it. inotify watches follow inodes, not mounts, so a watch on a direct bind
  // of the host's /usr saw every binary the host and every other sandbox ran; an overlay's
  // inodes are the sandbox's own, and the overlay reads the real files through internal files
  // that notify nobody. The clone is attached at the target itself and the overlay stacked on
  // it (lowerdir=<target>:<empty>), so the clone stays covered in the sandbox's mount table;
  // only a target whose path overlayfs' option syntax cannot carry is staged in <dir>/views/<i>
  // (five directories on the state dir's file system per sandbox were a measurable part of a
  // create, docs/isolation.md §7).
  struct Bind {
    std::string source;               // host path
    std::string target;               // rootfs + sandbox path
    std::string sandbox_path;         // for messages
    std::vector<std::string> mkdirs;  // components to create below rootfs, outermost first
    bool is_dir = true;
    bool read_only = true;
    bool view = false;         // a read-only directory: an overlay goes on top of the clone
    bool mask = false;         // an empty read-only directory: a clone of mask_dir instead
    bool shared = false;       // a member of the shared view (below): a clone of its subdirectory
    std::string shared_rel;    // that subdirectory, relative to the common source ("" for itself)
    std::string shared_path;   // <shared_view>/<shared_rel>, for messages
    std::string stage;         // where the clone is attached when not at `target`, else ""
    std::string view_overlay;  // overlay options for the target ("lowerdir=<clone>:<empty>")
  };
  std::string views_dir;    // <sandbox dir>/views, holding staging directories; "" if none
  std::string views_empty;  // the empty second lower of every view overlay (overlay needs two)
  bool make_views_empty = false;  // views_empty is the sandbox's own (the child creates it)
  std::vector<Bind> binds;
  // Read-only views whose sources lie in one host mount (base: /usr and /etc) share one
  // overlay, one superblock instead of one per view: an (idmapped) clone of the sources' common
  // ancestor is attached at `shared_view` on the disk, the overlay
  // (lowerdir=<shared_view>:<mask_dir>, read-only) on top of it, and each member is a clone of
  // its subdirectory of that overlay (reached through an O_PATH fd taken before the root overlay
  // covers the disk). The sandbox sees only the members' subtrees, as with separate views. Disk
  // only: the overlay's
  // second lower must lie on another file system than the sources (overlayfs refuses layers
  // nested in one another). Empty when fewer than two views share a mount.
  std::string shared_view_source;   // host path, the common ancestor
  std::string shared_view;          // <rootfs>/views on the disk
  std::string shared_view_overlay;  // lowerdir=<shared_view>:<mask_dir>

  std::string proc, dev, tmp;  // rootfs + /proc, /dev, /tmp
  std::string dev_data, tmp_data, shm_data, devpts_data;
  std::string dev_pts, dev_shm, dev_null;

  struct Node {
    std::string path;
    mode_t mode;
    dev_t rdev;
  };
  std::vector<Node> nodes;
  struct Link {
    std::string target;  // what the link points to
    std::string path;
  };
  std::vector<Link> links;
  std::vector<std::string> masked;     // rootfs/proc/...: hidden (tmpfs or /dev/null on top)
  std::vector<std::string> read_only;  // rootfs/proc/...: read-only bind on itself
};

// Validates the template and computes every path. `sandbox_dir` is <state>/sandboxes/<id>.
absl::StatusOr<MountPlan> BuildMountPlan(const TemplateSpec& tmpl, const std::string& sandbox_dir,
                                         const MountOptions& options = {});

// The root file system is an overlay: OK when `<proc_root>/filesystems` lists "overlay",
// otherwise FailedPrecondition saying how to get it.
absl::Status ProbeOverlayfs(const std::string& proc_root = "/proc");

// Child side (async-signal-safe). `userns_fd` is the sandbox's user namespace (idmaps the lower
// and the binds), or -1. Returns 0, or an errno value with *report filled.
// `disk_fd` is the sandbox's detached disk mount, or -1.
int SetupMounts(const MountPlan& plan, int userns_fd, int disk_fd, ChildReport* report);
// Child side: pivot_root into plan.rootfs; the host's tree then sits on top of the new root
// until DetachOldRoot (from a process whose working directory is still the new root).
int PivotRoot(const MountPlan& plan, ChildReport* report);
// umount2(".", MNT_DETACH): the host's tree leaves the namespace.
int DetachOldRoot(ChildReport* report);

}  // namespace sbx::runtime::ns
