#include "runtime/ns/cgroup_pool.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/digest.h"
#include "common/status_util.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

using cgroup_internal::Join;

namespace {

// A pooled directory and its work child, child first. A pooled set never held a task, so
// there is nothing to wait for.
absl::Status RemovePooledDir(const std::string& dir) {
  for (const std::string& d : {Join(dir, kWorkLeaf), dir}) {
    if (::rmdir(d.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, fmt::format("cgroup pool: rmdir({})", d));
    }
  }
  return absl::OkStatus();
}

}  // namespace

PooledCgroupSet::~PooledCgroupSet() {
  for (const auto& [key, dir] : dirs_) {
    if (absl::Status st = RemovePooledDir(dir); !st.ok()) {
      spdlog::warn("{}", std::string(st.message()));
    }
  }
}

absl::Status PooledCgroupSet::RenameTo(const std::string& key, const std::string& dest) {
  auto it = dirs_.find(key);
  if (it == dirs_.end()) {
    return absl::InternalError(fmt::format("cgroup pool: the set has no {} directory", key));
  }
  if (::rename(it->second.c_str(), dest.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("create cgroup: rename({}, {})", it->second, dest));
  }
  dirs_.erase(it);
  return absl::OkStatus();
}

CgroupSetPool::CgroupSetPool(int size, std::map<std::string, std::string> parents, std::string tag)
    : parents_(std::move(parents)),
      tag_(std::move(tag)),
      pool_(
          size, [this]() { return Make(); },
          [](const absl::Status& st) {
            spdlog::warn("cgroup pool: {} (retrying; launches make their cgroups meanwhile)",
                         std::string(st.message()));
            return true;
          }) {
  pool_.set_idle_priority(false);
  pool_.set_refill_delay(kCgroupPoolRefillDelay);
}

// The filler uses this object's members: it stops before they go.
CgroupSetPool::~CgroupSetPool() { pool_.Stop(); }

std::unique_ptr<PooledCgroupSet> CgroupSetPool::Take() {
  std::optional<std::unique_ptr<PooledCgroupSet>> item = pool_.Take();
  if (!item) return nullptr;
  return std::move(*item);
}

absl::StatusOr<std::unique_ptr<PooledCgroupSet>> CgroupSetPool::Make() {
  const std::string name = CgroupPoolPrefix(tag_) + std::to_string(serial_.fetch_add(1));
  std::map<std::string, std::string> made;
  // On a failure what was made goes with a set that owns it.
  auto fail = [&made](absl::Status st) -> absl::Status {
    PooledCgroupSet drop(std::move(made));
    return st;
  };
  for (const auto& [key, parent] : parents_) {
    const std::string dir = Join(parent, name);
    if (::mkdir(dir.c_str(), 0755) != 0) {
      return fail(ErrnoStatus(errno, fmt::format("cgroup pool: mkdir({})", dir)));
    }
    made[key] = dir;
    const std::string work = Join(dir, kWorkLeaf);
    if (::mkdir(work.c_str(), 0755) != 0) {
      return fail(ErrnoStatus(errno, fmt::format("cgroup pool: mkdir({})", work)));
    }
  }
  return std::make_unique<PooledCgroupSet>(std::move(made));
}

std::string CgroupPoolPrefix(const std::string& tag) { return fmt::format("pool-{}-", tag); }

std::string CgroupPoolTag(const std::string& state_dir) { return Sha256Hex(state_dir).substr(0, 12); }

absl::Status SweepCgroupPoolLeftovers(const std::vector<std::string>& parents, const std::string& tag) {
  const std::string prefix = CgroupPoolPrefix(tag);
  absl::Status result = absl::OkStatus();
  for (const std::string& parent : parents) {
    auto names = ListDir(parent);
    if (!names.ok()) {
      if (!absl::IsNotFound(names.status()) && result.ok()) result = names.status();
      continue;
    }
    for (const std::string& n : *names) {
      if (n.rfind(prefix, 0) != 0) continue;
      absl::Status st = RemovePooledDir(Join(parent, n));
      if (!st.ok() && result.ok()) result = st;
    }
  }
  return result;
}

}  // namespace sbx::runtime::ns
