// What the ns backend's files share (internal to src/runtime/ns): the state built once per
// backend and read by every Create and every instance, and the names of a sandbox's files.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/ns/agent_image.h"
#include "runtime/ns/caps.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/disk_image.h"
#include "runtime/ns/landlock.h"
#include "runtime/ns/netns_pool.h"
#include "runtime/ns/ns_backend.h"
#include "runtime/ns/reaper.h"
#include "runtime/ns/seccomp.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::ns {

inline constexpr char kIdPrefix[] = "sbx";
inline constexpr char kSocketName[] = "agent.sock";

using Clock = std::chrono::steady_clock;

inline double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Everything built once per backend and shared (read-only) by every Create and every instance.
struct NsBackend::Shared {
  NsOptions opts;
  std::string sandboxes_dir;
  std::string view_empty_dir;  // <state>/view-empty: the second lower of every read-only view
  absl::Status state_status = absl::OkStatus();
  absl::Status agent_status = absl::OkStatus();
  std::optional<AgentImage> agent;
  absl::Status seccomp_status = absl::OkStatus();
  SeccompProgram seccomp;
  // The agent's own filter when it stays outside the sandbox's user namespace (identity.h).
  SeccompProgram agent_seccomp;
  LandlockPlan landlock;  // abi 0: not used
  absl::Status caps_status = absl::OkStatus();
  CapsPlan caps;
  absl::Status cgroup_status = absl::OkStatus();
  std::unique_ptr<CgroupDriver> cgroups;
  std::unique_ptr<NetnsPool> netns_pool;  // null when NsOptions::netns_pool_size is 0
  absl::Status userns_status = absl::OkStatus();
  absl::Status disk_status = absl::OkStatus();
  std::unique_ptr<DiskProvider> disks;
  // Host-wide claims of uid ranges; meaningful only with opts.user_namespaces. Its methods
  // touch only files, so the const Shared& of Create may use it.
  mutable UidRanges uid_ranges;
  std::unique_ptr<UsernsPool> userns_pool;  // after uid_ranges: destroyed before it
  // Removes destroyed sandboxes' directories off the delete path; null removes them inline
  // (NsOptions::removal_backlog 0). Last: destroyed first, it finishes its queue.
  std::unique_ptr<Reaper> reaper;

  std::string DirOf(const std::string& id) const { return fmt::format("{}/{}", sandboxes_dir, id); }

  absl::Status Ready() const {
    SBX_RETURN_IF_ERROR(state_status);
    SBX_RETURN_IF_ERROR(agent_status);
    SBX_RETURN_IF_ERROR(seccomp_status);
    SBX_RETURN_IF_ERROR(caps_status);
    SBX_RETURN_IF_ERROR(cgroup_status);
    SBX_RETURN_IF_ERROR(userns_status);
    SBX_RETURN_IF_ERROR(disk_status);
    return absl::OkStatus();
  }
};

}  // namespace sbx::runtime::ns
