// When each sandbox was last used, for idle suspension (timers.cc).
//
// "Used" means a management call on the sandbox or one of its sessions, or an attach stream
// open on it; a session process still running also counts, but the store knows that, not this.
// Kept in memory only: after an sbxd restart every sandbox counts as used at start-up, which
// can only delay a suspension, never cause an early one.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace sbx::service {

class ActivityTracker {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ActivityTracker(Clock::time_point start = Clock::now()) : start_(start) {}

  void Touch(const std::string& sandbox_id, Clock::time_point now = Clock::now());

  // Holds a sandbox awake while an attach stream is open; touches it when closed.
  class StreamGuard {
   public:
    StreamGuard() = default;
    StreamGuard(ActivityTracker* t, std::string id) : t_(t), id_(std::move(id)) {}
    StreamGuard(StreamGuard&& o) noexcept : t_(std::exchange(o.t_, nullptr)), id_(std::move(o.id_)) {}
    StreamGuard& operator=(StreamGuard&&) = delete;
    ~StreamGuard();

   private:
    ActivityTracker* t_ = nullptr;
    std::string id_;
  };
  StreamGuard StreamOpened(const std::string& sandbox_id);

  // How long the sandbox has gone unused; nullopt while a stream is open. A sandbox never
  // touched counts from the tracker's start.
  std::optional<Clock::duration> IdleFor(const std::string& sandbox_id, Clock::time_point now) const;
  void Forget(const std::string& sandbox_id);

 private:
  struct Entry {
    Clock::time_point last;
    int streams = 0;
  };
  const Clock::time_point start_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace sbx::service
