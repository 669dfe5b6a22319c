#include "agent/event_log.h"

#include <utility>

namespace sbx::agent {

using protocol::Stream;

EventLog::EventLog(size_t budget_per_stream, size_t merge_up_to)
    : budget_(budget_per_stream == 0 ? 1 : budget_per_stream), merge_up_to_(merge_up_to) {}

uint64_t EventLog::AppendOutput(Stream stream, std::string_view data) {
  if (data.empty() || has_exit()) return 0;
  const size_t i = Index(stream);
  total_[i] += data.size();
  retained_[i] += data.size();
  if (!events_.empty()) {
    LogEvent& last = events_.back();
    // The exit event is never last here (has_exit() returned above), and an unsealed event
    // cannot have been delivered, so growing it changes nothing anyone has seen.
    if (last.id > sealed_ && last.stream == stream &&
        last.data.size() + data.size() <= merge_up_to_) {
      // An event that merges once is in a burst and likely grows to the cap: one allocation
      // instead of the doublings (each a copy of what is there) on the way.
      if (last.data.capacity() < merge_up_to_) last.data.reserve(merge_up_to_);
      last.data.append(data);
      Trim();
      return last.id;
    }
  }
  LogEvent ev;
  ev.id = next_id();
  ev.stream = stream;
  ev.offset = total_[i] - data.size();
  ev.data.assign(data);
  events_.push_back(std::move(ev));
  const uint64_t id = events_.back().id;
  // Growth can make already-delivered events at the front evictable.
  Trim();
  return id;
}

uint64_t EventLog::AppendExit(protocol::ExitEvent ev) {
  if (has_exit()) return exit_id_;
  LogEvent e;
  e.id = next_id();
  e.is_exit = true;
  ev.event_id = e.id;
  e.exit = std::move(ev);
  events_.push_back(std::move(e));
  exit_id_ = events_.back().id;
  return exit_id_;
}

// ">=" mirrors CanRead(): a stream sitting exactly at its budget must be trimmable, or its
// paused pipe would never be resumed.
bool EventLog::OverBudget() const {
  return retained_[0] >= budget_ || retained_[1] >= budget_;
}

bool EventLog::EvictFront() {
  if (events_.empty() || events_.front().id > delivered_) return false;
  const LogEvent& front = events_.front();
  // The exit event carries no bytes, so an over-budget log never reaches it.
  if (front.is_exit) return false;
  const size_t i = Index(front.stream);
  retained_[i] -= front.data.size();
  evicted_[i] += front.data.size();
  events_.pop_front();
  ++first_id_;
  return true;
}

bool EventLog::MarkDelivered(uint64_t id) {
  if (id >= next_id()) id = next_id() - 1;
  if (id > delivered_) delivered_ = id;
  Seal(id);
  return Trim();
}

bool EventLog::Trim() {
  bool evicted = false;
  // Retention keeps up to `budget` bytes per stream for late re-attaches; only the excess is
  // dropped, oldest first, and events of the other stream go with it to keep ids contiguous.
  while (OverBudget() && EvictFront()) evicted = true;
  return evicted;
}

size_t EventLog::DropDelivered() {
  const size_t before = retained_[0] + retained_[1];
  while (EvictFront()) {
  }
  return before - (retained_[0] + retained_[1]);
}

bool EventLog::CanRead(Stream stream) const { return retained_[Index(stream)] < budget_; }

std::optional<protocol::ResyncEvent> EventLog::ResyncFor(uint64_t after) const {
  if (after >= first_id_ - 1) return std::nullopt;  // first_id_ >= 1; no overflow
  protocol::ResyncEvent r;
  r.oldest_available_id = first_id_;
  r.stdout_offset = evicted_[Index(Stream::kStdout)];
  r.stderr_offset = evicted_[Index(Stream::kStderr)];
  return r;
}

const LogEvent* EventLog::Get(uint64_t id) const {
  if (id < first_id_ || id >= next_id()) return nullptr;
  return &events_[id - first_id_];
}

}  // namespace sbx::agent
