// What this host offers sandboxes, read for every admission (service/admission.h): the
// syscalls and /proc files the service itself never touches.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend.h"
#include "service/admission.h"

namespace sbx::daemon {

// MemTotal of a /proc/meminfo text, in KiB.
std::optional<int64_t> ParseMemTotalKib(std::string_view meminfo);

// vcpu: the CPUs sbxd may run on (sched_getaffinity), lowered to a backend's cgroup quota;
// memory: MemTotal, lowered to a backend's cgroup limit; disk: what statvfs(state_dir) says is
// free for unprivileged users plus what the backends' sandbox disks already allocated.
absl::StatusOr<service::HostCapacity> ProbeHostCapacity(
    const std::string& state_dir, const std::vector<const runtime::Backend*>& backends);

// The same from given readings (for tests): `affinity_cpus`, `meminfo` text, free bytes.
service::HostCapacity CombineHostCapacity(int64_t affinity_cpus, int64_t memtotal_kib,
                                          int64_t disk_free_bytes,
                                          const std::vector<runtime::HostShare>& shares);

}  // namespace sbx::daemon
