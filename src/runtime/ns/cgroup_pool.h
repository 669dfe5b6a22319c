// Pre-built cgroup v1 directory sets, so a launch renames a set instead of making it.
//
// Why: a memory cgroup's mkdir costs the kernel ~0.3 ms here (its per-node shrinker maps and
// per-CPU statistics, under the global cgroup_mutex), and a split sandbox has two of them; with
// pids and cpu that was 0.9-1.8 ms of a ~4.4 ms cold create (docs/benchmarks.md, "Pre-built
// cgroup sets"). An idle-priority thread now makes the sets ahead.
//
// A pooled set is fresh: it never held a task, so no counter (memory.max_usage_in_bytes,
// memory.oom_control's oom_kill, cpuacct usage) carries over; a deleted sandbox's cgroup is
// never reused. Its limits are written at take, as for a new directory.
//
// Names: `pool-<tag>-<serial>` in each v1 hierarchy's `sbx` parent, with the `work` child made
// as well. The tag is this sbxd's (a digest of its state directory), so sbxds sharing the
// parents each sweep only their own leftovers (SweepCgroupPoolLeftovers at start). At take each
// directory is renamed to the sandbox's id, so a running sandbox's cgroups carry its id as
// without the pool. cgroup v1 allows a rename within the same parent; v2 has no rename at all
// (the unified hierarchy, pure v2 hosts), so those directories are still made at launch.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/ns/ready_pool.h"

namespace sbx::runtime::ns {

// One pooled set: hierarchy key ("memory", "pids", "cpu", "freezer") -> directory. Removes
// what it still owns when destroyed (work child first).
class PooledCgroupSet {
 public:
  explicit PooledCgroupSet(std::map<std::string, std::string> dirs) : dirs_(std::move(dirs)) {}
  ~PooledCgroupSet();
  PooledCgroupSet(const PooledCgroupSet&) = delete;
  PooledCgroupSet& operator=(const PooledCgroupSet&) = delete;

  const std::map<std::string, std::string>& dirs() const { return dirs_; }
  // rename(2) of the set's directory of `key` to `dest` (same parent). Once renamed it is no
  // longer this set's to remove.
  absl::Status RenameTo(const std::string& key, const std::string& dest);

 private:
  std::map<std::string, std::string> dirs_;
};

// The filler refills only after launches pause for kCgroupPoolRefillDelay (a launch that found
// the pool empty counts): its mkdirs hold the kernel's cgroup_mutex, which the launch that took
// a set needs next (clone into the cgroup, joining the v1 hierarchies). Refilled at once, the
// launch's clone..exec grew by what the rename saved, and under a steady stream of launches
// refills beside them cost the sustained scenario ~6% (docs/benchmarks.md). So the pool serves
// a create after a pause; a stream of creates makes its own. Nice 19, not SCHED_IDLE, for the
// same lock.
inline constexpr std::chrono::milliseconds kCgroupPoolRefillDelay{100};

class CgroupSetPool {
 public:
  // `parents`: hierarchy key -> the `sbx` parent directory in that v1 hierarchy.
  CgroupSetPool(int size, std::map<std::string, std::string> parents, std::string tag);
  ~CgroupSetPool();

  void Start() { pool_.Start(); }
  std::unique_ptr<PooledCgroupSet> Take();
  int ready() const { return pool_.ready(); }

  // Makes one set now (what the filler runs); public for tests.
  absl::StatusOr<std::unique_ptr<PooledCgroupSet>> Make();

 private:
  const std::map<std::string, std::string> parents_;
  const std::string tag_;
  std::atomic<uint64_t> serial_{0};
  ReadyPool<std::unique_ptr<PooledCgroupSet>> pool_;
};

// The name prefix of this sbxd's pooled sets: "pool-<tag>-".
std::string CgroupPoolPrefix(const std::string& tag);
// A short tag for a state directory (the first 12 hex digits of its path's SHA-256).
std::string CgroupPoolTag(const std::string& state_dir);
// Removes `pool-<tag>-*` directories (and their work children) left in `parents` by an earlier
// run of this sbxd. Directories of other tags are left alone.
absl::Status SweepCgroupPoolLeftovers(const std::vector<std::string>& parents, const std::string& tag);

}  // namespace sbx::runtime::ns
