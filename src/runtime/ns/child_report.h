// What the child (between clone3 and execveat) reports to the parent when a step fails: a
// fixed-size record written to the CLOEXEC sync pipe, turned into a Status by the parent.
#pragma once

#include <cstdint>

namespace sbx::runtime::ns {

// Child steps in execution order (see docs/isolation.md).
enum class Step : uint16_t {
  kNone = 0,
  kSignals,           // reset signal mask and dispositions
  kSetsid,            // own session: host terminal signals never reach the sandbox
  kJoinNetns,         // setns into a network namespace built ahead (netns_pool.h)
  kPrepareNetns,      // fresh netns only: lo up, then ip_unprivileged_port_start=0 (index = stage)
  kJoinCgroup,        // write "0" to a pre-opened cgroup.procs (index = which)
  kUnshareCgroupNs,   // unshare(CLONE_NEWCGROUP)
  kMakeRootPrivate,   // mount("", "/", MS_REC|MS_PRIVATE)
  kMountDisk,         // move_mount of the sandbox's disk to <dir>/disk
  kIdmapLower,        // template rootfs -> <dir>/lower (index: 0 open_tree, 1 mount_setattr, 2 move_mount)
  kImageLayer,        // an image layer -> <dir>/l<i> (index: 4 * layer + the kIdmapLower stage, 3 mkdir)
  kMaskDir,           // the sandbox's empty mask directory (index: 0 mkdir, 1 open)
  kMountOverlay,      // overlay at rootfs
  kBindMkdir,         // create the mount point of a bind (index = bind)
  kBindMount,         // open_tree(OPEN_TREE_CLONE) of the bind's source (index = bind)
  kBindSetattr,       // mount_setattr: idmap, read-only, nosuid, nodev (index = bind)
  kBindMove,          // move_mount onto the mount point, or the view's staging dir (index = bind)
  kBindView,          // read-only overlay of the staged clone at the mount point (index = bind)
  kMkdirMountpoint,   // proc/dev/tmp mount points (index: 0 proc, 1 dev, 2 tmp)
  kMountProc,
  kMountDev,
  kMknod,             // index = device
  kSymlink,           // index = link
  kMountDevpts,
  kMountShm,
  kMaskProc,          // index = masked path
  kReadonlyProc,      // index = read-only path
  kMountTmp,
  kChdirRootfs,
  kPivotRoot,
  kDetachOldRoot,
  kChdirNewRoot,
  kSethostname,
  kStdio,             // stdin /dev/null, stdout/stderr agent.log, fd 3 the socket, fd 4 the OOM counter
  kRlimit,            // setrlimit (index: 0 RLIMIT_NOFILE, 1 RLIMIT_CORE)
  kJoinUserns,        // setns(user namespace fd, CLONE_NEWUSER)
  kSetgroups,         // setgroups(0, NULL) inside the user namespace
  kSetresgid,         // setresgid(0, 0, 0)
  kSetresuid,         // setresuid(0, 0, 0)
  kCapsBounding,
  kCapsAmbient,
  kCapset,
  kNoNewPrivs,
  kLandlock,          // landlock_create_ruleset / add_rule / restrict_self
  kSeccomp,
  kCloseRange,        // index: 0 dup3 of the child's own fds, 1 close_range of the rest, 2 CLOEXEC before exec
  kExec,
};

struct ChildReport {
  uint16_t step = 0;
  uint16_t index = 0;
  int32_t err = 0;
};

}  // namespace sbx::runtime::ns
