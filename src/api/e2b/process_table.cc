#include "api/e2b/process_table.h"

#include <algorithm>

namespace sbx::api::e2b {

void ProcessTable::UnindexLocked(const ProcessEntry& e) {
  auto p = by_pid_.find({e.sandbox_id, e.pid});
  if (p != by_pid_.end() && p->second == e.session_id) by_pid_.erase(p);
  if (e.tag) {
    auto t = by_tag_.find({e.sandbox_id, *e.tag});
    if (t != by_tag_.end() && t->second == e.session_id) by_tag_.erase(t);
  }
}

void ProcessTable::EvictLocked() {
  while (by_session_.size() > max_ && !order_.empty()) {
    const std::string id = std::move(order_.front());
    order_.pop_front();
    auto it = by_session_.find(id);
    if (it == by_session_.end()) continue;
    UnindexLocked(it->second);
    by_session_.erase(it);
  }
  // Replaced entries leave stale ids in order_: keep it within twice the bound.
  if (order_.size() > 2 * max_ + 16) {
    std::deque<std::string> kept;
    for (std::string& id : order_) {
      if (by_session_.count(id)) kept.push_back(std::move(id));
    }
    order_ = std::move(kept);
  }
}

void ProcessTable::Put(ProcessEntry e) {
  std::lock_guard lock(mu_);
  if (auto it = by_session_.find(e.session_id); it != by_session_.end()) {
    e.delivered = std::max(e.delivered, it->second.delivered);
    UnindexLocked(it->second);
    it->second = e;
  } else {
    by_session_.emplace(e.session_id, e);
    order_.push_back(e.session_id);
  }
  if (e.pid > 0) by_pid_[{e.sandbox_id, e.pid}] = e.session_id;
  if (e.tag) by_tag_[{e.sandbox_id, *e.tag}] = e.session_id;
  EvictLocked();
}

std::optional<ProcessEntry> ProcessTable::BySession(const std::string& session_id) const {
  std::lock_guard lock(mu_);
  auto it = by_session_.find(session_id);
  if (it == by_session_.end()) return std::nullopt;
  return it->second;
}

std::optional<ProcessEntry> ProcessTable::ByPid(const std::string& sandbox_id, int64_t pid) const {
  std::lock_guard lock(mu_);
  auto p = by_pid_.find({sandbox_id, pid});
  if (p == by_pid_.end()) return std::nullopt;
  auto it = by_session_.find(p->second);
  if (it == by_session_.end()) return std::nullopt;
  return it->second;
}

std::optional<ProcessEntry> ProcessTable::ByTag(const std::string& sandbox_id,
                                                const std::string& tag) const {
  std::lock_guard lock(mu_);
  auto t = by_tag_.find({sandbox_id, tag});
  if (t == by_tag_.end()) return std::nullopt;
  auto it = by_session_.find(t->second);
  if (it == by_session_.end()) return std::nullopt;
  return it->second;
}

void ProcessTable::Delivered(const std::string& session_id, uint64_t event_id) {
  std::lock_guard lock(mu_);
  auto it = by_session_.find(session_id);
  if (it != by_session_.end() && event_id > it->second.delivered) it->second.delivered = event_id;
}

size_t ProcessTable::size() const {
  std::lock_guard lock(mu_);
  return by_session_.size();
}

}  // namespace sbx::api::e2b
