// Admission control: a sandbox is created (or built for the warm pool) only when what it may
// use fits in what the host has, so that the limits set on one sandbox also protect the host.
//
// Capacity per resource = what the host has (HostCapacity, probed by sbxd at every admission)
// × its overcommit ratio − the reserve kept for the host and sbxd. Memory and disk are not
// overcommitted by default (ratio 1.0): a sandbox that uses its whole limit must not push the
// host into its OOM killer or fill the state dir's file system. CPU time is shared fairly by
// the kernel's scheduler and only slows down when oversubscribed, so it is overcommitted.
//
// The ledger holds the resources (vcpu, memory_mib, disk_mib of effective_resources) of every
// sandbox that may use them: creating, running, paused and suspended ones (frozen processes
// keep their memory), deleting ones until the delete is done, and every warm-pool member (built
// or being built). Failed and deleted sandboxes hold nothing. Admit checks and holds in one
// step under the ledger's lock, so concurrent creates cannot overshoot.
//
// A request that does not fit now is insufficient_capacity (unavailable: a delete will
// make room; also when max_sandboxes are held, details.resource "sandboxes"); one larger than the whole capacity is exceeds_capacity (it never will). Both
// name the resource in the message and in details (resource, requested, available, capacity).
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::service {

// Operator settings (docs/config.md, admission.*); a reload (SIGHUP) applies them to the
// next admission. Ratios are percentages (100 = no overcommit).
struct AdmissionSettings {
  bool enabled = true;
  int64_t cpu_overcommit_percent = 1600;
  int64_t memory_overcommit_percent = 100;
  int64_t disk_overcommit_percent = 100;
  int64_t reserve_memory_mib = 1024;
  int64_t reserve_disk_mib = 2048;
  // Sandboxes (warm-pool members included) held at once, whatever their resources, and even
  // with `enabled` false: past the host's descriptors, pids or namespaces a launch fails
  // midway, so sbxd sets this to what the host's limits hold (runtime/doctor/density.h) when
  // the operator leaves it 0. 0 here: no count cap (tests of other things).
  int64_t max_sandboxes = 0;
  friend bool operator==(const AdmissionSettings&, const AdmissionSettings&) = default;
};

// What the host offers the sandboxes of this sbxd.
struct HostCapacity {
  int64_t vcpu = 0;        // online CPUs (affinity, cgroup quota)
  int64_t memory_mib = 0;  // MemTotal, or the cgroup limit the sandboxes live under
  // The space sandbox disks can grow into: free space in the state dir's file system plus
  // what the disks of the held sandboxes already take (their images are sparse).
  int64_t disk_mib = 0;
};

// What one sandbox holds.
struct Demand {
  int64_t vcpu = 0;
  int64_t memory_mib = 0;
  int64_t disk_mib = 0;
  Demand& operator+=(const Demand& o) {
    vcpu += o.vcpu;
    memory_mib += o.memory_mib;
    disk_mib += o.disk_mib;
    return *this;
  }
  friend bool operator==(const Demand&, const Demand&) = default;
};

// Host × ratio − reserve, per resource (never below 0).
Demand CapacityOf(const HostCapacity& host, const AdmissionSettings& s);

// OK when `want` fits beside `reserved` in `capacity`; otherwise one of the two errors above.
// `what` names the requester in the message ("the sandbox", "a warm-pool sandbox").
absl::Status CheckFits(const Demand& want, const Demand& reserved, const Demand& capacity,
                       const HostCapacity& host, const AdmissionSettings& s,
                       std::string_view what);

class Admission {
 public:
  using Probe = std::function<absl::StatusOr<HostCapacity>()>;

  // Without a probe nothing is checked (the ledger is still kept): for tests of other things.
  Admission(AdmissionSettings settings, Probe probe);

  void SetSettings(const AdmissionSettings& s);
  AdmissionSettings settings() const;

  // Holds `want` for `id` when it fits (or admission is off); an id already held is replaced.
  absl::Status Admit(const std::string& id, const Demand& want, std::string_view what);
  // Holds without a check: what the store says existing sandboxes hold (start-up).
  void Hold(const std::string& id, const Demand& want);
  // Returns true when `id` was held.
  bool Release(const std::string& id);
  bool Holds(const std::string& id) const;

  struct Snapshot {
    bool enabled = true;
    bool probed = false;  // false: no probe, or it failed (host/capacity are zero)
    HostCapacity host;
    Demand capacity;
    Demand reserved;
    int64_t holders = 0;
  };
  // For metrics and the doctor: probes the host once.
  Snapshot Read() const;

 private:
  Demand ReservedLocked() const;
  // insufficient_capacity when max_sandboxes are held (not counting `id`).
  absl::Status CheckCountLocked(const std::string& id, std::string_view what) const;

  const Probe probe_;
  mutable std::mutex mu_;
  AdmissionSettings settings_;
  std::map<std::string, Demand> held_;
};

}  // namespace sbx::service
