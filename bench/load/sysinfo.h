// Host facts the density scenario and the report need: /proc/meminfo, a process's RSS, and
// where a process's memory cgroup lives (cgroup v1 memory mount, or pure cgroup v2).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

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

// --- Repeatable forms: CPU time and syscalls per operation ----------------------------------------
// Wall-clock latency on a shared VM moves by 30% with the neighbours' load; the CPU an operation
// costs and the syscalls it makes do not. SbxdMeter runs `perf stat -e
// task-clock,raw_syscalls:sys_enter -p SBXD_PID` with its counters disabled, and enables them
// only between Begin() and End(), around the timed steps of a scenario. perf's counters follow
// every thread and process sbxd starts after the meter attached (the sandboxes' holders, agents
// and the agents' children), so the figure is sbxd + agent + the command, user and kernel time
// in their own context. Kernel threads (kworkers, RCU callbacks, jbd2, loop workers) are not in
// that tree; `host_cpu_ms_per_op` adds them from /proc/stat (every CPU's busy time over the same
// windows), which also counts whatever else runs, so it is meaningful on an idle host only.
// A meter that cannot run (no pid, no perf, perf refused) says why in `cpu_unavailable` and the
// scenario runs unmetered.
struct PerfCounts {
  double task_clock_ms = 0;
  uint64_t syscalls = 0;
};
// `perf stat -x,` output: "4.42,msec,task-clock,…" and "348,,raw_syscalls:sys_enter,…".
absl::StatusOr<PerfCounts> ParsePerfStatCsv(std::string_view text);
// The busy ticks of /proc/stat's "cpu " line (user nice system irq softirq steal).
absl::StatusOr<uint64_t> ParseProcStatBusyTicks(std::string_view proc_stat);

class SbxdMeter {
 public:
  explicit SbxdMeter(int sbxd_pid);  // 0: inert (no --sbxd-pid)
  ~SbxdMeter();                      // stops perf (by its pid) and removes its files
  SbxdMeter(const SbxdMeter&) = delete;
  SbxdMeter& operator=(const SbxdMeter&) = delete;

  bool active() const { return perf_pid_ > 0 && error_.empty(); }
  void Begin();
  // Closes the window opened by Begin(); `ops` operations (and `bytes` of payload) ran in it.
  void End(double ops, double bytes = 0);
  // Stops perf and writes cpu_ms_per_op, syscalls_per_op, host_cpu_ms_per_op (and
  // cpu_ns_per_byte when bytes were counted) with their basis into `extra`, or
  // cpu_unavailable with the reason.
  void AddTo(nlohmann::json& extra);

 private:
  absl::Status Command(const char* cmd);
  absl::StatusOr<PerfCounts> Stop();

  int sbxd_pid_ = 0;
  pid_t perf_pid_ = -1;
  int ctl_fd_ = -1, ack_fd_ = -1;
  std::string dir_;
  std::string error_;
  double ops_ = 0, bytes_ = 0;
  uint64_t host_ticks_ = 0;
  std::optional<uint64_t> window_start_ticks_;
};

// For the report's meta block.
std::string Hostname();
std::string KernelRelease();
std::string UtcNow();  // RFC 3339, seconds
// `git rev-parse --short HEAD` in the current directory, "" if not a checkout.
std::string GitCommit();

}  // namespace sbx::load
