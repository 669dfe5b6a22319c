#include "agent/procfs.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "common/unique_fd.h"

namespace sbx::agent {

bool ReadSmallFile(const std::string& path, std::string& out, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  out.clear();
  char buf[4096];
  while (out.size() < max) {
    ssize_t n = ::read(fd.get(), buf, std::min(sizeof(buf), max - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return true;
}

std::optional<ProcInfo> ReadProc(pid_t pid, std::string& text) {
  ProcInfo p;
  p.pid = pid;
  if (!ReadSmallFile(fmt::format("/proc/{}/stat", pid), text)) return std::nullopt;
  // "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice threads itrealvalue starttime ...": comm may hold spaces
  // and parentheses, so parse after the last ')'.
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  p.comm = CutField(std::string_view(text).substr(open + 1, close - open - 1));
  int ppid = 0, pgrp = 0, sid = 0;
  unsigned long long start = 0;
  if (std::sscanf(text.c_str() + close + 1,
                  " %c %d %d %d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &p.state, &ppid, &pgrp, &sid, &start) != 5) {
    return std::nullopt;
  }
  p.ppid = ppid;
  p.pgrp = pgrp;
  p.sid = sid;
  p.start_ticks = start;
  if (ReadSmallFile(fmt::format("/proc/{}/status", pid), text)) {
    const size_t at = text.find("\nUid:");
    if (at != std::string::npos) {
      p.uid = static_cast<uid_t>(std::strtoul(text.c_str() + at + 5, nullptr, 10));
    }
  }
  return p;
}

std::vector<pid_t> LiveDescendants(pid_t root) {
  std::unordered_map<pid_t, pid_t> parent;
  std::vector<pid_t> live;
  DIR* d = ::opendir("/proc");
  if (!d) return {};
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
    if (!fd) continue;
    char buf[512];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    buf[n] = '\0';
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the
    // last ')'.
    char* close = std::strrchr(buf, ')');
    if (!close) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(close + 1, " %c %d", &state, &ppid) != 2) continue;
    parent[static_cast<pid_t>(pid)] = ppid;
    if (state != 'Z' && state != 'X') live.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  std::vector<pid_t> out;
  for (pid_t p : live) {
    for (pid_t q = parent.count(p) ? parent[p] : 0, hops = 0; q > 0 && hops < 4096; ++hops) {
      if (q == root) {
        out.push_back(p);
        break;
      }
      auto it = parent.find(q);
      q = it == parent.end() ? 0 : it->second;
    }
  }
  return out;
}

}  // namespace sbx::agent
