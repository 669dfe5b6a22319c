// What the agent reads from /proc: the small fields of a process's stat and status, and the
// live descendants of a process.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sbx::agent {

// The small fields of /proc/PID/stat and status, for every process: the first pass keeps
// only these, whatever the guest runs. argv is read per process as its entry is written.
struct ProcInfo {
  pid_t pid = 0, ppid = 0, pgrp = 0, sid = 0;
  char state = '?';
  uint64_t start_ticks = 0;
  uid_t uid = 0;
  std::string comm;
};

// Reads at most `max` bytes of `path` into `out`; false when it cannot be opened.
bool ReadSmallFile(const std::string& path, std::string& out, size_t max = 64 << 10);

// /proc/<pid>/stat and status; `text` is a scratch buffer reused between calls.
std::optional<ProcInfo> ReadProc(pid_t pid, std::string& text);

// Pids of the live (non-zombie) processes descending from `root`, from /proc.
std::vector<pid_t> LiveDescendants(pid_t root);

}  // namespace sbx::agent
