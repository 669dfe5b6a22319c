#include "agent/procfs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string_view>

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

std::optional<ProcInfo> ParseStat(const std::string& text) {
  // "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice threads itrealvalue starttime ...": comm may hold spaces
  // and parentheses, so parse after the last ')'.
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  ProcInfo p;
  int ppid = 0, pgrp = 0, sid = 0;
  unsigned long long start = 0;
  if (std::sscanf(text.c_str() + close + 1,
                  " %c %d %d %d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &p.state, &ppid, &pgrp, &sid, &start) != 5) {
    return std::nullopt;
  }
  p.comm = CutField(std::string_view(text).substr(open + 1, close - open - 1));
  p.ppid = ppid;
  p.pgrp = pgrp;
  p.sid = sid;
  p.start_ticks = start;
  return p;
}

std::optional<ProcInfo> ReadProc(pid_t pid, std::string& text, bool with_uid) {
  if (!ReadSmallFile(fmt::format("/proc/{}/stat", pid), text)) return std::nullopt;
  std::optional<ProcInfo> p = ParseStat(text);
  if (!p) return std::nullopt;
  p->pid = pid;
  if (with_uid && ReadSmallFile(fmt::format("/proc/{}/status", pid), text)) {
    const size_t at = text.find("\nUid:");
    if (at != std::string::npos) {
      p->uid = static_cast<uid_t>(std::strtoul(text.c_str() + at + 5, nullptr, 10));
    }
  }
  return p;
}

bool DescendsFrom(const ParentMap& parent, pid_t pid, pid_t ancestor) {
  auto up = [&](pid_t q) {
    auto it = parent.find(q);
    return it == parent.end() ? 0 : it->second;
  };
  for (pid_t q = up(pid), hops = 0; q > 0 && hops < 4096; ++hops) {
    if (q == ancestor) return true;
    q = up(q);
  }
  return false;
}

std::vector<pid_t> LiveDescendants(pid_t root) {
  ParentMap parent;
  std::vector<pid_t> live;
  std::string text;
  ForEachProcess([&](pid_t pid) {
    const std::optional<ProcInfo> p = ReadProc(pid, text, /*with_uid=*/false);
    if (!p) return;
    parent[pid] = p->ppid;
    if (p->state != 'Z' && p->state != 'X') live.push_back(pid);
  });
  std::vector<pid_t> out;
  for (pid_t p : live) {
    if (DescendsFrom(parent, p, root)) out.push_back(p);
  }
  return out;
}

}  // namespace sbx::agent
