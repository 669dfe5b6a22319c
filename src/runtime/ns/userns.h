// Per-sandbox user namespaces.
//
// Every sandbox gets its own range of 65536 host uids/gids, mapped to 0..65535 inside: sandbox
// root is an unprivileged host uid that no other sandbox and no host user shares, so sandboxes
// cannot signal, ptrace or read each other's processes and files even if another boundary
// fails. The ranges come from systemd's container range (0x80000..0x6FFEFFFF, see
// systemd's UIDS-GIDS.md), 28664 of them.
//
// Ranges are claimed host-wide, not per sbxd: a claim is a file /run/sbx/uid-ranges/<base>
// created with O_EXCL whose content names the sandbox directory that owns it, so several sbxd
// instances on one host (a test daemon beside the real one) never hand out the same range.
//
// The namespace itself is built by the parent (MakeUserNamespace) and joined by the launch
// child with setns() after it has mounted everything as real root: mount, network, ipc and
// time namespaces stay owned by the host's user namespace, so sandbox root cannot change
// mounts, routes or firewall rules (feasibility.md §4.2 step 4).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "runtime/ns/ready_pool.h"

namespace sbx::runtime::ns {

inline constexpr uint32_t kUidRangeSize = 65536;
inline constexpr uint32_t kUidRangeFirst = 0x80000;
inline constexpr uint32_t kUidRangeEnd = 0x6FFF0000;  // exclusive
inline constexpr char kDefaultUidClaimDir[] = "/run/sbx/uid-ranges";

class UidRanges {
 public:
  explicit UidRanges(std::string claim_dir = kDefaultUidClaimDir);

  // Creates the claim directory (mode 0700).
  absl::Status Init();
  // Claims a free range for `owner` (the sandbox's directory). Next-fit from a per-process
  // cursor, so a range just released is the last to be reused.
  absl::StatusOr<uint32_t> Claim(const std::string& owner);
  // Claims `base` again for an adopted sandbox: succeeds when the claim is missing (then it is
  // re-created) or already names `owner`.
  absl::Status Reclaim(uint32_t base, const std::string& owner);
  // Drops the claim if it names `owner`. Idempotent.
  absl::Status Release(uint32_t base, const std::string& owner);
  // Drops every claim naming `owner` (removal of a sandbox whose range is not known).
  absl::Status ReleaseOwner(const std::string& owner);
  // Hands the claim of `base` from `from` to `to` (a pooled range to its sandbox). The new
  // owner is written to a temporary file renamed over the claim, so that a concurrent sweep
  // never reads a claim without an owner.
  absl::Status Transfer(uint32_t base, const std::string& from, const std::string& to);
  // Start-up: drops the claims whose owner lies under `sandboxes_dir` and is not a known id,
  // and any claim whose owner directory no longer exists (left by a crash of any sbxd).
  absl::Status Sweep(const std::string& sandboxes_dir, const std::set<std::string>& known_ids);

  const std::string& dir() const { return dir_; }

 private:
  std::string PathOf(uint32_t base) const;

  std::string dir_;
};

// The sandbox's processes get the first 65535 uids of its range (0..65534 inside: root to
// nobody); the last one, never mapped inside, is the agent's. The agent then shares no
// credentials with anything sandbox root can become: it is not sandbox root's to signal,
// prlimit, renice, ptrace or OOM-adjust (its /proc/1 files belong to host root), and it owns
// the sandbox's user namespace, which gives it every capability there (to start processes
// in it) and sandbox root none over the agent.
inline constexpr uint32_t kGuestUidCount = kUidRangeSize - 1;
inline constexpr uint32_t AgentUidOf(uint32_t base) { return base + kGuestUidCount; }

// A user namespace mapping 0..count-1 to host base..base+count-1 (uids and gids), as an fd
// for setns(), owned by host root, or by `owner` when given (the agent's uid: see above).
// Costs one short-lived child (clone3 sharing our memory), ~0.3 ms.
absl::StatusOr<UniqueFd> MakeUserNamespace(uint32_t base, uint32_t count = kUidRangeSize,
                                           std::optional<uid_t> owner = std::nullopt);

struct PreparedUserns {
  uint32_t base = 0;
  UniqueFd fd;
};

// Ranges claimed and their namespaces built ahead of launches by a thread at idle CPU
// priority (the namespace costs a short-lived child and three /proc writes, ~1 ms on these
// VMs). Pooled claims name `pool_owner` (a directory of this sbxd that exists while it runs);
// Take() transfers the claim to the sandbox. Unused claims are released on destruction, and
// a crash's leftovers by NsBackend's start-up (ReleaseOwner of the pool owner).
class UsernsPool {
 public:
  UsernsPool(UidRanges* ranges, std::string pool_owner, int size);
  ~UsernsPool();

  void Start();
  // A range claimed for `owner` with its namespace: from the pool, or made now when it is
  // empty (or has size 0).
  absl::StatusOr<PreparedUserns> Take(const std::string& owner);
  int ready() const;

 private:
  absl::StatusOr<PreparedUserns> Make(const std::string& owner);

  UidRanges* ranges_;
  const std::string pool_owner_;
  ReadyPool<PreparedUserns> pool_;  // last: its filler stops before the members above go
};

// Whether the file system holding `dir` can be idmapped: an idmapped clone of `dir` is made
// once, detached (never attached anywhere), so a host that cannot is told at start-up (and by
// `sbx doctor`), not at the first create. Needs root; costs one user namespace.
absl::Status ProbeIdmap(const std::string& dir);

// The host uid that uid 0 of `pid`'s user namespace maps to (first line of uid_map), for
// adopting sandboxes whose persisted state predates the field.
absl::StatusOr<uint32_t> ReadUidBase(pid_t pid);

}  // namespace sbx::runtime::ns
