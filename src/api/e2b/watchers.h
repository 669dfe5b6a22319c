// The polling watchers of envd's filesystem service (CreateWatcher, GetWatcherEvents,
// RemoveWatcher; envd_filesystem.cc), which the sync Python SDK's watch_dir uses: each is an
// agent watch (AgentClient::Watch) pumped by a coroutine into a bounded queue that the client
// drains by polling.
//
// Bounded: at most kMaxPerSandbox watchers per sandbox and kMaxTotal in all; at most kMaxEvents
// queued events per watcher (later ones are dropped and the next poll says so); a watcher
// nobody polled for kIdle is dropped (its pump ends, and with it the agent's watch worker).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::api::e2b {

using Clock = std::chrono::steady_clock;

// One watcher; shared between the table and its pump.
class Watcher {
 public:
  static constexpr size_t kMaxEvents = 4096;

  explicit Watcher(Clock::time_point now) : last_poll_(now) {}
  // The pump: queues a FilesystemEvent (dropped beyond kMaxEvents).
  void Push(nlohmann::json event);
  // The pump: the agent's watch ended (ok: the directory went away) or failed.
  void End(absl::Status why);
  // Whether the pump should stop: removed, or not polled for `idle`.
  bool Abandoned(Clock::time_point now, Clock::duration idle) const;
  void Close();
  // GetWatcherEvents: the events since the last poll. When the watch ended and every event
  // was handed out, the error it ended with (not_found for a directory that went away).
  absl::StatusOr<std::vector<nlohmann::json>> Drain(Clock::time_point now);

 private:
  mutable std::mutex mu_;
  std::deque<nlohmann::json> events_;
  size_t dropped_ = 0;
  bool ended_ = false;
  bool closed_ = false;
  absl::Status end_status_;
  Clock::time_point last_poll_;
};

class WatcherTable {
 public:
  static constexpr size_t kMaxPerSandbox = 64;
  static constexpr size_t kMaxTotal = 4096;
  static constexpr Clock::duration kIdle = std::chrono::minutes(5);

  // A new watcher of `sandbox_id` with its id; resource_exhausted beyond the bounds (after
  // dropping the abandoned ones).
  absl::StatusOr<std::pair<std::string, std::shared_ptr<Watcher>>> Add(
      const std::string& sandbox_id, Clock::time_point now);
  // The sandbox's watcher `id`, or nullptr (never another sandbox's).
  std::shared_ptr<Watcher> Get(const std::string& sandbox_id, const std::string& id) const;
  // Closes and forgets it; false when the sandbox has no such watcher.
  bool Remove(const std::string& sandbox_id, const std::string& id);
  size_t size() const;

 private:
  void SweepLocked(Clock::time_point now);

  mutable std::mutex mu_;
  // (sandbox id, watcher id) -> watcher
  std::map<std::pair<std::string, std::string>, std::shared_ptr<Watcher>> watchers_;
  uint64_t next_ = 0;
};

}  // namespace sbx::api::e2b
