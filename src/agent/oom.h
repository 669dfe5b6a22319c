// OOM attribution inside a sandbox.
//
// The kernel's OOM killer takes one task (v1 has no memory.oom.group, and on v2 sbxd does not
// set it because it would take the agent along). sbxd opens the sandbox's OOM counter (v1
// memory.oom_control, v2 memory.events; both carry a line "oom_kill N") read-only and hands
// the fd to the agent (--oom-counter-fd). The agent reads the counter when a session starts;
// when the session's process is then killed by SIGKILL and the counter has grown, the kill is
// attributed to OOM: the exit event says oom_killed and the agent SIGKILLs the rest of the
// session's process group, so a session is contained as a whole (memory.oom.group at session
// level).
//
// Limits of the heuristic, accepted by design:
//   * the counter is per sandbox, so a SIGKILL (e.g. from `sbx kill -9`) that lands while
//     another session of the same sandbox is OOM-killed is reported as oom_killed too;
//   * a session whose leader survives an OOM kill of one of its own children keeps running
//     and is not flagged (the leader sees the child's SIGKILL and decides);
//   * processes that left the session's process group (setsid, setpgid) are not killed.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sbx::agent {

// The value of the "oom_kill N" line, exactly that key (not "oom_group_kill"). A text without
// that line, or with a malformed value, counts as 0.
uint64_t ParseOomKillCount(std::string_view text);

// pread of the whole counter file at offset 0 (cgroup files regenerate on each read).
// nullopt when the read fails; callers treat that as "no OOM seen".
std::optional<uint64_t> ReadOomKillCount(int fd);

}  // namespace sbx::agent
