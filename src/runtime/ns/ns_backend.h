// The `ns` runtime: each sandbox is sbx-agent running as PID 1 of fresh mount, pid, ipc, uts,
// net and cgroup namespaces, on an overlay root, inside its own cgroups, with a reduced
// capability set, no_new_privs and a seccomp filter. docs/isolation.md walks through every
// privileged step.
//
// Layout on the host, per sandbox `<id>`:
//   <state_dir>/sandboxes/<id>/disk.img              the writable layer's ext4 image (disk_mib)
//   <state_dir>/sandboxes/<id>/{disk,lower,rootfs}   mount points: the image (holding the
//                                                    overlay's upper/work), the idmapped
//                                                    template, the overlay root
//   <state_dir>/disk-images/                         golden images and the ready pool
//   /run/sbx/uid-ranges/<base>                       the sandbox's host uid range (userns.h)
//   <state_dir>/sandboxes/<id>/agent.sock            the agent's listening socket (mode 0600)
//   <state_dir>/sandboxes/<id>/agent.log             the agent's stdout/stderr
//   <cgroup of each hierarchy>/<own>/sbx/<id>        see cgroup.h
// Mounts exist only inside the sandbox's mount namespace and vanish with its last process.
//
// One sbxd per host owns the `sbx` cgroup parents: Sweep() removes every sandbox cgroup it does
// not know.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "protocol/limits.h"
#include "runtime/backend.h"

namespace sbx::net {
class NetworkHost;
}

namespace sbx::runtime::ns {

inline constexpr int64_t kCpuPeriodUs = 100000;
// How long Create() waits for the agent's first ping answer.
inline constexpr int kAgentReadyTimeoutMs = 10000;
// How long Adopt() waits for a ping answer.
inline constexpr int kAdoptPingTimeoutMs = 2000;

struct NsOptions {
  std::string state_dir;             // e.g. /var/lib/sbx
  std::string agent_path;            // e.g. build/bin/sbx-agent; read once at construction
  std::string cgroup_root_override;  // cgroupfs root instead of the mount points in /proc/mounts
  size_t agent_buffer_bytes = 0;     // 0 = protocol::kDefaultOutputBufferBytes
  std::string proc_root = "/proc";   // tests only: where /proc/self/cgroup and mounts are read
  // Remount the host's cgroup2 with `favordynmods` when launches join cgroups by writing
  // cgroup.procs (hybrid v1 layouts): see cgroup_favor.h. Host-wide; off keeps the host as is.
  bool cgroup_favor_dynmods = false;
  // Where sandbox cgroups go (CgroupEnv::parent): empty = <own cgroup>/sbx.
  std::string cgroup_parent;
  // Network namespaces kept ready for launches (netns_pool.h); 0 creates each at launch.
  int netns_pool_size = 0;
  // sbxd's host side of networked sandboxes (src/net), outliving the backend; null: networking
  // off, and a networked SandboxSpec::egress fails the create.
  net::NetworkHost* network = nullptr;
  // Each sandbox in its own user namespace with its own host uid range (userns.h). Off only
  // for hosts that cannot idmap the state dir's file system: sandbox root is then host root
  // with a reduced capability set.
  bool user_namespaces = true;
  // Uid ranges claimed and user namespaces built ahead for launches (userns.h UsernsPool);
  // 0 builds each during the launch (~1 ms more).
  int userns_pool_size = 0;
  // Disks (disk_image.h) of this size kept mounted and ready for launches; 0 makes each at
  // launch (~10-16 ms more per create).
  int disk_pool_size = 0;
  int disk_pool_mib = static_cast<int>(Resources{}.disk_mib);
  // Cgroup directory sets built ahead and renamed at launch (cgroup_pool.h); 0 makes each at
  // launch (~1 ms more per create here). Only cgroup v1 hierarchies can be pooled.
  int cgroup_pool_size = 0;
  // Where host-wide uid range claims live (userns.h); tests point it elsewhere.
  std::string uid_claim_dir = "/run/sbx/uid-ranges";
  // Seccomp policy file (format: seccomp_policy.json); empty = the policy embedded at build time.
  std::string seccomp_policy_path;
  // The agent's own cgroup budget (cgroup.h CgroupLimits::agent_memory_bytes), beside and on
  // top of the sandbox's limits; 0 puts the agent in the workload's cgroup (no split).
  int agent_memory_mib = 256;
  int agent_pids = 256;
  // Destroyed sandboxes' directories (their disk image, upper layer, socket and log) queued for
  // a background removal, at most this many at once (reaper.h); 0 removes each inside Destroy.
  size_t removal_backlog = 0;
};

class NsBackend : public Backend {
 public:
  // Loads the agent into a sealed memfd, builds the seccomp filter, detects the cgroup layout
  // and prepares the `sbx` cgroup parents. Failures are kept and reported by Probe() and
  // Create(), so constructing never fails.
  explicit NsBackend(NsOptions options);
  ~NsBackend() override;

  std::string Name() const override { return "ns"; }
  Capabilities GetCapabilities() const override;
  absl::Status Probe() override;
  absl::StatusOr<InstancePtr> Create(const SandboxSpec& spec) override;
  absl::StatusOr<InstancePtr> Adopt(const std::string& id, const Json& persisted) override;
  // Kills and removes whatever is left of sandbox `id` (processes in its cgroups, the cgroups,
  // its state dir), without needing a live agent. Idempotent.
  absl::Status Remove(const std::string& id) override;
  absl::Status Sweep(const std::set<std::string>& known_ids) override;
  // The disk pool makes disks of the new default disk_mib.
  void OnDefaultsChanged(const Resources& defaults) override;
  // The tightest memory and CPU limits on the path from the sandboxes' cgroup parent to the
  // root of each hierarchy, and the blocks allocated by <sandboxes>/*/disk.img.
  HostShare Share() const override;

  // For tests and diagnostics: the cgroup directories a sandbox with this id uses, keyed by
  // hierarchy ("memory", "pids", "cpu", "unified"); the agent's socket and the sandbox dir.
  std::map<std::string, std::string> CgroupPaths(const std::string& id) const;
  std::string SandboxDir(const std::string& id) const;
  // Name of the cgroup driver in use ("cgroup-v1+v2-hybrid", "cgroup-v2", ...), "" if none.
  std::string CgroupDriverName() const;

  struct Shared;

 private:
  absl::Status RemoveById(const std::string& id);

  std::shared_ptr<Shared> shared_;
};

}  // namespace sbx::runtime::ns
