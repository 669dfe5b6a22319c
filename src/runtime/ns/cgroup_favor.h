// The cgroup `favordynmods` mount option (Linux >= 6.0).
//
// Moving a task into a cgroup takes cgroup_threadgroup_rwsem for writing. By default that
// percpu rwsem makes every writer wait for an RCU grace period first, so a launch that joins
// v1 hierarchies by writing cgroup.procs (the hybrid layout, where CLONE_INTO_CGROUP cannot place
// a task in v1 hierarchies) sleeps 5-20 ms on this kind of VM. With favordynmods the kernel keeps
// the rwsem in its slow-reader mode instead: forks and exits pay a little, migrations become
// sub-millisecond. The option is global (one rwsem for all hierarchies) and is set by remounting
// the cgroup2 mount with its existing options plus `favordynmods`.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

struct Cgroup2Mount {
  std::string mount_point;   // unescaped
  std::string mount_opts;    // per-mount options, e.g. "rw,nosuid,nodev,noexec,relatime"
  std::string super_opts;    // superblock options, e.g. "rw,nsdelegate,memory_recursiveprot"
};

// The first cgroup2 mount in a /proc/PID/mountinfo text; NotFound when there is none.
absl::StatusOr<Cgroup2Mount> FindCgroup2Mount(std::string_view mountinfo);

struct RemountArgs {
  unsigned long flags = 0;  // MS_REMOUNT plus the per-mount flags to keep
  std::string data;         // superblock options to keep, plus favordynmods
};
// What mount(2) needs to add favordynmods while keeping every other option of `m`.
RemountArgs FavorDynmodsRemountArgs(const Cgroup2Mount& m);

bool HasOption(std::string_view opts, std::string_view name);

// Enables favordynmods on the host's cgroup2 mount (found through `proc_root`/self/mountinfo).
// OK when it was already on. An error says which step failed, or that the kernel ignored the
// option (too old, or sbxd is not in the initial cgroup namespace).
absl::Status EnableCgroupFavorDynmods(const std::string& proc_root);

}  // namespace sbx::runtime::ns
