#include "api/e2b/watchers.h"

#include <fmt/format.h>

#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::api::e2b {

void Watcher::Push(nlohmann::json event) {
  std::lock_guard lock(mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

void Watcher::End(absl::Status why) {
  std::lock_guard lock(mu_);
  if (ended_) return;
  ended_ = true;
  end_status_ = std::move(why);
}

bool Watcher::Abandoned(Clock::time_point now, Clock::duration idle) const {
  std::lock_guard lock(mu_);
  return closed_ || now - last_poll_ > idle;
}

void Watcher::Close() {
  std::lock_guard lock(mu_);
  closed_ = true;
}

absl::StatusOr<std::vector<nlohmann::json>> Watcher::Drain(Clock::time_point now) {
  std::lock_guard lock(mu_);
  last_poll_ = now;
  if (events_.empty() && dropped_ > 0) {
    const size_t n = dropped_;
    dropped_ = 0;
    return ApiError(absl::StatusCode::kResourceExhausted, "too_many_events",
                    fmt::format("{} events were dropped: more than {} arrived between two polls",
                                n, kMaxEvents));
  }
  if (events_.empty() && ended_) {
    if (end_status_.ok()) {
      return ApiError(absl::StatusCode::kNotFound, "not_found",
                      "the watched directory no longer exists");
    }
    return end_status_;
  }
  std::vector<nlohmann::json> out(std::make_move_iterator(events_.begin()),
                                  std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

absl::StatusOr<std::pair<std::string, std::shared_ptr<Watcher>>> WatcherTable::Add(
    const std::string& sandbox_id, Clock::time_point now) {
  std::lock_guard lock(mu_);
  SweepLocked(now);
  size_t mine = 0;
  for (auto it = watchers_.lower_bound({sandbox_id, ""});
       it != watchers_.end() && it->first.first == sandbox_id; ++it) {
    ++mine;
  }
  if (mine >= kMaxPerSandbox || watchers_.size() >= kMaxTotal) {
    return ApiError(absl::StatusCode::kResourceExhausted, "too_many_watchers",
                    fmt::format("the sandbox has {} watchers (at most {}); remove one first",
                                mine, kMaxPerSandbox));
  }
  // Unguessable, though the table only ever answers the sandbox's own envd token.
  std::string id = fmt::format("w{}-{}", ++next_, NewId("w").substr(2, 12));
  auto w = std::make_shared<Watcher>(now);
  watchers_[{sandbox_id, id}] = w;
  return std::make_pair(std::move(id), std::move(w));
}

std::shared_ptr<Watcher> WatcherTable::Get(const std::string& sandbox_id,
                                           const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = watchers_.find({sandbox_id, id});
  return it == watchers_.end() ? nullptr : it->second;
}

bool WatcherTable::Remove(const std::string& sandbox_id, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = watchers_.find({sandbox_id, id});
  if (it == watchers_.end()) return false;
  it->second->Close();
  watchers_.erase(it);
  return true;
}

size_t WatcherTable::size() const {
  std::lock_guard lock(mu_);
  return watchers_.size();
}

void WatcherTable::SweepLocked(Clock::time_point now) {
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second->Abandoned(now, kIdle)) {
      it->second->Close();
      it = watchers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace sbx::api::e2b
