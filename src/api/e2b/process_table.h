// What envd's process service keeps between calls (envd_process.cc): for the sessions E2B
// started, their pid, tag and config as the client gave them, and how far E2B streams have
// relayed their output (so that Connect sends new output only).
//
// A cache, not the truth: the pid <-> session mapping of any session is read back from the
// sandbox's agent (its process list names every process's session, its status the session's
// pid) when the table does not have it, so sbx sessions started elsewhere and sessions started
// before an sbxd restart are found too; only tags, and the delivered mark, are lost with a
// restart (Connect then replays what the agent still retains). Bounded: the oldest entries go
// first; entries outlive their sessions (an exited session is found here, then reported
// not_found by the agent).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sbx::api::e2b {

// ProcessConfig as E2B's List reports it.
struct ProcessConfigInfo {
  std::string cmd;
  std::vector<std::string> args;
  std::map<std::string, std::string> envs;
  std::optional<std::string> cwd;
};

struct ProcessEntry {
  std::string sandbox_id;
  std::string session_id;
  int64_t pid = 0;
  std::optional<std::string> tag;
  // nullopt: not started by E2B (found through the agent); List then reads the session's spec.
  std::optional<ProcessConfigInfo> config;
  bool pty = false;
  // The id of the last agent event an E2B stream relayed (0: none).
  uint64_t delivered = 0;
};

class ProcessTable {
 public:
  static constexpr size_t kDefaultMaxEntries = 16384;
  explicit ProcessTable(size_t max_entries = kDefaultMaxEntries) : max_(max_entries) {}

  // Adds or replaces the entry of e.session_id; a (sandbox, pid) or (sandbox, tag) another
  // session held now names this one (pids are reused).
  void Put(ProcessEntry e);
  std::optional<ProcessEntry> BySession(const std::string& session_id) const;
  std::optional<ProcessEntry> ByPid(const std::string& sandbox_id, int64_t pid) const;
  // The newest session with this tag.
  std::optional<ProcessEntry> ByTag(const std::string& sandbox_id, const std::string& tag) const;
  // Raises the session's delivered mark to `event_id` (no-op for an unknown session).
  void Delivered(const std::string& session_id, uint64_t event_id);
  size_t size() const;

 private:
  void EvictLocked();
  void UnindexLocked(const ProcessEntry& e);

  const size_t max_;
  mutable std::mutex mu_;
  std::map<std::string, ProcessEntry> by_session_;
  std::map<std::pair<std::string, int64_t>, std::string> by_pid_;
  std::map<std::pair<std::string, std::string>, std::string> by_tag_;
  std::deque<std::string> order_;  // session ids, oldest first (may hold replaced ones)
};

}  // namespace sbx::api::e2b
