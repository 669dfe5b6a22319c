#include "agent/event_log.h"

#include <cstring>
#include <utility>

namespace sbx::agent {

using protocol::Stream;

EventLog::EventLog(size_t budget_per_stream, size_t merge_up_to)
    : budget_(budget_per_stream == 0 ? 1 : budget_per_stream), merge_up_to_(merge_up_to) {}

uint64_t EventLog::AppendOutput(Stream stream, std::string_view data) {
  std::span<char> room = ReserveOutput(stream, data.size());
  if (data.empty() || room.size() < data.size()) return 0;  // empty, or after the exit
  std::memcpy(room.data(), data.data(), data.size());
  return CommitOutput(stream, data.size());
}

bool EventLog::MergesIntoTail(Stream stream, size_t n) const {
  if (events_.empty()) return false;
  const LogEvent& last = events_.back();
  // An unsealed event cannot have been handed to a connection, so growing it changes nothing
  // anyone has seen (and no connection shares its bytes). The exit event is never unsealed
  // and last when output is appended: has_exit() ends appending.
  return last.id > sealed_ && !last.is_exit && last.stream == stream &&
         last.bytes->size() + n <= merge_up_to_;
}

std::span<char> EventLog::ReserveOutput(Stream stream, size_t max) {
  reserved_.reset();
  reserved_room_ = 0;
  if (max == 0 || has_exit()) return {};
  reserved_room_ = max;
  reserved_stream_ = stream;
  if (MergesIntoTail(stream, max)) {
    std::shared_ptr<OutputBytes>& tail = events_.back().bytes;
    if (tail->capacity() - tail->size() < max) {
      // An event that merges once is in a burst and likely grows to the cap: one allocation
      // (and one copy of what is there) instead of the doublings on the way.
      auto grown = std::make_shared<OutputBytes>(merge_up_to_);
      std::memcpy(grown->end(), tail->view().data(), tail->size());
      grown->Commit(tail->size());
      tail = std::move(grown);
    }
    return {tail->end(), max};
  }
  reserved_ = std::make_shared<OutputBytes>(max);
  return {reserved_->end(), max};
}

uint64_t EventLog::CommitOutput(Stream stream, size_t n) {
  const size_t room = reserved_room_;
  reserved_room_ = 0;
  // Nothing reserved for this stream, or nothing read: nothing to add.
  if (n == 0 || n > room || stream != reserved_stream_ || has_exit()) {
    reserved_.reset();
    return 0;
  }
  const size_t i = Index(stream);
  total_[i] += n;
  retained_[i] += n;
  if (!reserved_) {
    // ReserveOutput returned room in the tail (it is still the newest: nothing came between).
    events_.back().bytes->Commit(n);
    Trim();
    return events_.back().id;
  }
  reserved_->Commit(n);
  LogEvent ev;
  ev.id = next_id();
  ev.stream = stream;
  ev.offset = total_[i] - n;
  ev.bytes = std::move(reserved_);
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
  retained_[i] -= front.bytes->size();
  evicted_[i] += front.bytes->size();
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
