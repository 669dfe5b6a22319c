// Host facts the density scenario and the report need: /proc/meminfo, a process's RSS, and
// where a process's memory cgroup lives (cgroup v1 memory mount, or pure cgroup v2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::load {

absl::StatusOr<uint64_t> MemAvailableBytes();
// A "kB" field of /proc/meminfo in bytes ("SUnreclaim").
absl::StatusOr<uint64_t> MeminfoBytes(std::string_view field);
// Open descriptors of `pid` (entries of /proc/PID/fd).
absl::StatusOr<size_t> OpenFds(int pid);
// VmRSS of `pid` in bytes.
absl::StatusOr<uint64_t> ProcessRssBytes(int pid);

struct MemoryCgroup {
  std::string dir;         // absolute directory of the cgroup
  std::string usage_file;  // memory.usage_in_bytes (v1) or memory.current (v2)
};
// The memory cgroup `pid` is in.
absl::StatusOr<MemoryCgroup> MemoryCgroupOf(int pid);

// Pure parsers, tested without a /proc.
// From /proc/PID/cgroup: the v1 line whose controller list has "memory", else the v2 "0::" line.
struct CgroupLine {
  std::string path;
  bool v2 = false;
};
absl::StatusOr<CgroupLine> ParseMemoryCgroupLine(std::string_view proc_cgroup);
// From /proc/self/mountinfo: the mount point and root of the v1 memory hierarchy ("" if none).
struct CgroupMount {
  std::string mount_point;
  std::string root;
};
CgroupMount FindV1MemoryMount(std::string_view mountinfo);
// "kB" fields of /proc/meminfo and /proc/PID/status ("MemAvailable:  123 kB") in bytes.
absl::StatusOr<uint64_t> ParseKbField(std::string_view text, std::string_view field);

absl::StatusOr<std::string> ReadFile(const std::string& path);
// The pids listed in a cgroup's cgroup.procs.
std::vector<int> CgroupPids(const std::string& dir);

// For the report's meta block.
std::string Hostname();
std::string KernelRelease();
std::string UtcNow();  // RFC 3339, seconds
// `git rev-parse --short HEAD` in the current directory, "" if not a checkout.
std::string GitCommit();

}  // namespace sbx::load
