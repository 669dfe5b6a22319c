#include "service/activity.h"

#include <algorithm>

namespace sbx::service {

void ActivityTracker::Touch(const std::string& sandbox_id, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto [it, inserted] = entries_.try_emplace(sandbox_id, Entry{now, 0});
  if (!inserted) it->second.last = std::max(it->second.last, now);
}

ActivityTracker::StreamGuard ActivityTracker::StreamOpened(const std::string& sandbox_id) {
  std::lock_guard lock(mu_);
  auto [it, inserted] = entries_.try_emplace(sandbox_id, Entry{Clock::now(), 0});
  ++it->second.streams;
  return StreamGuard(this, sandbox_id);
}

ActivityTracker::StreamGuard::~StreamGuard() {
  if (!t_) return;
  std::lock_guard lock(t_->mu_);
  auto it = t_->entries_.find(id_);
  if (it == t_->entries_.end()) return;  // forgotten: the sandbox was deleted meanwhile
  it->second.streams = std::max(0, it->second.streams - 1);
  it->second.last = std::max(it->second.last, Clock::now());
}

std::optional<ActivityTracker::Clock::duration> ActivityTracker::IdleFor(
    const std::string& sandbox_id, Clock::time_point now) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(sandbox_id);
  const Clock::time_point last = it == entries_.end() ? start_ : it->second.last;
  if (it != entries_.end() && it->second.streams > 0) return std::nullopt;
  return now > last ? now - last : Clock::duration::zero();
}

void ActivityTracker::Forget(const std::string& sandbox_id) {
  std::lock_guard lock(mu_);
  entries_.erase(sandbox_id);
}

}  // namespace sbx::service
