// processes: every process of the sandbox with the session it belongs to.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "agent/loop.h"
#include "agent/procfs.h"
#include "agent/users.h"
#include "common/status_util.h"
#include "common/time_util.h"

namespace sbx::agent {
namespace {

using protocol::Json;

// uid -> name from the sandbox's /etc/passwd (the agent is static: no NSS).
std::map<int64_t, std::string> PasswdNamesFromFile(const std::set<int64_t>& wanted) {
  std::string text;
  if (wanted.empty() || !ReadSmallFile("/etc/passwd", text, 1 << 20)) return {};
  return PasswdNames(text, wanted);
}

}  // namespace

std::string Agent::HandleProcesses() {
  std::vector<ProcInfo> all;
  std::string text;  // one buffer for every small /proc read
  const bool listed = ForEachProcess([&](pid_t pid) {
    if (auto p = ReadProc(pid, text)) all.push_back(std::move(*p));
  });
  if (!listed) return DumpJson(ErrorJson(ErrnoStatus(errno, "processes: opendir(/proc)")));
  const pid_t self = ::getpid();
  // As PID 1 every process of the namespace is the sandbox's. Elsewhere (the fake runtime on
  // the host) only our descendants are.
  ParentMap parent;
  for (const ProcInfo& p : all) parent[p.pid] = p.ppid;
  auto ours = [&](pid_t pid) { return self == 1 || DescendsFrom(parent, pid, self); };
  std::erase_if(all, [&](const ProcInfo& p) { return p.pid == self || !ours(p.pid); });
  // A process belongs to the session whose leader's pid is its process group or session id:
  // both are inherited by children (unless they call setsid/setpgid themselves, then null).
  // A group id cannot be handed to a new process while the group exists, so an exited
  // session's leftovers are still attributed correctly; of sessions with the same leader pid
  // (reuse after the group died), the latest started wins.
  std::unordered_map<pid_t, const Session*> by_leader;
  for (const auto& [id, s] : sessions_) {
    auto [it, added] = by_leader.emplace(s->pid, s.get());
    if (!added && it->second->started_at < s->started_at) it->second = s.get();
  }
  long ticks = ::sysconf(_SC_CLK_TCK);
  if (ticks <= 0) ticks = 100;
  int64_t btime = 0;
  if (ReadSmallFile("/proc/stat", text, 1 << 20)) {
    const size_t at = text.find("\nbtime ");
    if (at != std::string::npos) btime = std::strtoll(text.c_str() + at + 7, nullptr, 10);
  }
  std::set<int64_t> uids;
  for (const ProcInfo& p : all) uids.insert(opts_.identity.ToSandboxId(p.uid));
  const auto names = PasswdNamesFromFile(uids);
  // Entry by entry into text (bounded.h): a tree of every entry is what a guest with huge
  // argv used to grow the agent's memory with, and sbxd's after it.
  ListReply reply("processes", protocol::kMaxProcessEntries);
  for (const ProcInfo& p : all) {
    if (reply.full()) break;
    // Read now and never whole: a cmdline can be MiBs.
    BoundedArgv argv;
    if (UniqueFd fd(::open(fmt::format("/proc/{}/cmdline", p.pid).c_str(), O_RDONLY | O_CLOEXEC));
        fd) {
      argv = ReadArgv(fd.get());
    }
    const Session* s = nullptr;
    if (auto it = by_leader.find(p.pgrp); it != by_leader.end()) s = it->second;
    if (!s) {
      if (auto it = by_leader.find(p.sid); it != by_leader.end()) s = it->second;
    }
    const int64_t uid = opts_.identity.ToSandboxId(p.uid);
    auto name = names.find(uid);
    Json j = {{"pid", p.pid},
              {"ppid", p.ppid},
              {"pgid", p.pgrp},
              {"state", std::string(1, p.state)},
              {"comm", p.comm},
              {"argv", std::move(argv.args)},
              {"argv_truncated", argv.truncated},
              {"uid", uid},
              {"user", name == names.end() ? Json(nullptr) : Json(name->second)},
              {"started_at", nullptr},
              {"session_id", s ? Json(s->id) : Json(nullptr)}};
    if (btime > 0) {
      const int64_t ms = btime * 1000 + static_cast<int64_t>(p.start_ticks) * 1000 / ticks;
      const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
      j["started_at"] = FormatRfc3339(at);
    }
    reply.Add(j);
  }
  return reply.Finish();
}

}  // namespace sbx::agent
