#include "daemon/host_capacity.h"

#include <sched.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "common/files.h"
#include "common/status_util.h"

namespace sbx::daemon {

std::optional<int64_t> ParseMemTotalKib(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemTotal:";
  size_t at = meminfo.find(kKey);
  if (at == std::string_view::npos || (at > 0 && meminfo[at - 1] != '\n')) return std::nullopt;
  at += kKey.size();
  while (at < meminfo.size() && meminfo[at] == ' ') ++at;
  int64_t kib = 0;
  auto [end, ec] = std::from_chars(meminfo.data() + at, meminfo.data() + meminfo.size(), kib);
  if (ec != std::errc() || end == meminfo.data() + at || kib <= 0) return std::nullopt;
  return kib;
}

service::HostCapacity CombineHostCapacity(int64_t affinity_cpus, int64_t memtotal_kib,
                                          int64_t disk_free_bytes,
                                          const std::vector<runtime::HostShare>& shares) {
  service::HostCapacity out;
  out.vcpu = affinity_cpus;
  out.memory_mib = memtotal_kib >> 10;
  out.disk_mib = disk_free_bytes >> 20;
  for (const auto& s : shares) {
    // A quota of 1.5 CPUs gives 1 whole vCPU to promise (never 0: that would refuse all).
    if (s.cpu_quota_millis > 0) {
      out.vcpu = std::min(out.vcpu, std::max<int64_t>(1, s.cpu_quota_millis / 1000));
    }
    if (s.memory_limit_mib > 0) out.memory_mib = std::min(out.memory_mib, s.memory_limit_mib);
    out.disk_mib += s.disk_allocated_mib;
  }
  return out;
}

absl::StatusOr<service::HostCapacity> ProbeHostCapacity(
    const std::string& state_dir, const std::vector<const runtime::Backend*>& backends) {
  // Sized for hosts with more CPUs than a cpu_set_t holds.
  int64_t cpus = 0;
  for (size_t n = 1024; n <= (size_t{1} << 20) && cpus == 0; n *= 4) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) return absl::ResourceExhaustedError("admission: CPU_ALLOC");
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    if (::sched_getaffinity(0, bytes, set) == 0) {
      cpus = CPU_COUNT_S(bytes, set);
    } else if (errno != EINVAL) {
      const int err = errno;
      CPU_FREE(set);
      return ErrnoStatus(err, "admission: sched_getaffinity");
    }
    CPU_FREE(set);
  }
  if (cpus <= 0) return absl::InternalError("admission: sched_getaffinity reported no CPU");

  SBX_ASSIGN_OR_RETURN(const std::string meminfo, ReadFileToString("/proc/meminfo"));
  auto kib = ParseMemTotalKib(meminfo);
  if (!kib) return absl::InternalError("admission: no MemTotal in /proc/meminfo");

  struct statvfs vfs {};
  if (::statvfs(state_dir.c_str(), &vfs) != 0) {
    return ErrnoStatus(errno, fmt::format("admission: statvfs({})", state_dir));
  }
  const int64_t free_bytes =
      static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);

  std::vector<runtime::HostShare> shares;
  for (const runtime::Backend* b : backends) shares.push_back(b->Share());
  return CombineHostCapacity(cpus, *kib, free_bytes, shares);
}

}  // namespace sbx::daemon
