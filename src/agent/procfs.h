// What the agent reads from /proc: one parser of /proc/<pid>/stat, one walk up the parent
// chain, and the processes listed there.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <unordered_map>
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

// The text of /proc/<pid>/stat; every field but pid and uid.
std::optional<ProcInfo> ParseStat(const std::string& text);

// /proc/<pid>/stat, and status for the uid when `with_uid`; `text` is a scratch buffer
// reused between calls.
std::optional<ProcInfo> ReadProc(pid_t pid, std::string& text, bool with_uid = true);

// Calls fn(pid) for every process listed in /proc; false (errno set) when it cannot be read.
template <typename Fn>
bool ForEachProcess(Fn fn) {
  DIR* d = ::opendir("/proc");
  if (!d) return false;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    fn(static_cast<pid_t>(pid));
  }
  const int saved = errno;
  ::closedir(d);
  errno = saved;
  return true;
}

using ParentMap = std::unordered_map<pid_t, pid_t>;  // pid -> ppid, from one scan of /proc

// True when `ancestor` is on the chain of parents above `pid` (not `pid` itself). A scan
// races with exits and pid reuse, so the chain may hold a loop: it ends after 4096 hops.
bool DescendsFrom(const ParentMap& parent, pid_t pid, pid_t ancestor);

// Pids of the live (non-zombie) processes descending from `root`, from /proc.
std::vector<pid_t> LiveDescendants(pid_t root);

}  // namespace sbx::agent
