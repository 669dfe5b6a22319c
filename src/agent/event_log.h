// EventLog: the retained output of one session, and the arithmetic behind "no lost output".
//
// Events get ids 1, 2, 3, ... across stdout chunks, stderr chunks and finally the exit event.
// Memory is bounded per stream by `budget` bytes, but an event is only ever evicted
//   - from the front (so the retained ids are always one contiguous range), and
//   - once some connection has been sent it (id <= delivered()).
// When a stream is at or over budget and nothing more can be evicted, CanRead() turns false
// and the caller stops reading that stream's pipe: the process then blocks in write() instead
// of its output being dropped. A reader that keeps up therefore receives every byte.
//
// No I/O here; the agent's event loop owns the pipes and sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "protocol/protocol.h"

namespace sbx::agent {

// The bytes of one output event. Filled while the event is the log's open (unsealed) tail,
// then never changed, and shared: a connection sends large events from here instead of from a
// copy (Agent::Refill), and a faster connection's delivery may evict the event meanwhile.
// Allocated uninitialised: a pipe read fills it directly (EventLog::ReserveOutput).
class OutputBytes {
 public:
  explicit OutputBytes(size_t capacity)
      : buf_(std::make_unique_for_overwrite<char[]>(capacity)), capacity_(capacity) {}
  std::string_view view() const { return {buf_.get(), size_}; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  char* end() { return buf_.get() + size_; }
  void Commit(size_t n) { size_ += n; }  // n bytes were written at end()

 private:
  std::unique_ptr<char[]> buf_;
  size_t size_ = 0;
  size_t capacity_;
};

struct LogEvent {
  uint64_t id = 0;
  bool is_exit = false;
  protocol::Stream stream = protocol::Stream::kStdout;  // output events only
  uint64_t offset = 0;                                  // output events only
  std::shared_ptr<OutputBytes> bytes;                   // output events only
  protocol::ExitEvent exit;                             // exit event only

  std::string_view data() const { return bytes ? bytes->view() : std::string_view(); }
};

class EventLog {
 public:
  // `merge_up_to` > 0 lets AppendOutput grow the newest event instead of adding one, see there.
  explicit EventLog(size_t budget_per_stream, size_t merge_up_to = 0);

  // Appends one chunk of output; always accepted (the exit drain ignores the budget).
  // Returns its id. Empty chunks are not logged and return 0.
  // While no connection has taken the newest event yet (its id > sealed()), a chunk of the same
  // stream is added to it as long as it stays within `merge_up_to` bytes, and its id is
  // returned. Output that piles up while every reader is busy thus leaves as a few large
  // events instead of many small ones (each event costs a frame, an SSE event and a write on
  // the way to the client), while a reader that keeps up still gets every chunk at once.
  uint64_t AppendOutput(protocol::Stream stream, std::string_view data);
  // AppendOutput without the copy, for a read straight into the log: room for up to `max`
  // bytes at the stream's end (in the newest event when AppendOutput would merge `max` bytes
  // into it, else in a new buffer of `max` bytes: ask for what there is to read), of which CommitOutput then adds the first `n` as AppendOutput
  // would; it returns AppendOutput's id (0 for n = 0 or more than was reserved). The room is
  // valid until the next call that changes the log; a reservation not committed is
  // forgotten. Empty after the exit event.
  std::span<char> ReserveOutput(protocol::Stream stream, size_t max);
  uint64_t CommitOutput(protocol::Stream stream, size_t n);

  // Freezes every event up to `id`: called before an event is handed to any connection, since
  // ids and bytes a client has seen must be replayed exactly.
  void Seal(uint64_t id) {
    if (id > sealed_) sealed_ = id;
  }
  uint64_t sealed() const { return sealed_; }
  // Appends the final event; fills in ev.event_id. Nothing may be appended afterwards.
  uint64_t AppendExit(protocol::ExitEvent ev);

  // Records that every event up to `id` has been fully written to some connection, then
  // evicts what the budget requires. Returns true when something was evicted.
  bool MarkDelivered(uint64_t id);

  // Evicts every delivered output event, whatever the budget (memory pressure from finished
  // sessions). Returns the number of bytes freed.
  size_t DropDelivered();

  // False when `stream` holds at least `budget` bytes that cannot be evicted yet.
  bool CanRead(protocol::Stream stream) const;

  // Replay: the first id a connection that has seen everything up to `after` should get,
  // and the resync it must be sent first when some of those events are gone.
  std::optional<protocol::ResyncEvent> ResyncFor(uint64_t after) const;
  // The retained event with this id, or nullptr if evicted or not yet appended.
  const LogEvent* Get(uint64_t id) const;

  uint64_t oldest_id() const { return first_id_; }          // == next_id() when empty
  uint64_t next_id() const { return first_id_ + events_.size(); }
  uint64_t delivered() const { return delivered_; }
  bool has_exit() const { return exit_id_ != 0; }
  uint64_t exit_id() const { return exit_id_; }
  size_t retained_bytes(protocol::Stream s) const { return retained_[Index(s)]; }
  // Bytes ever appended to / evicted from a stream; the latter is the offset of the first
  // retained byte of that stream (or of the next byte when none is retained).
  uint64_t total_bytes(protocol::Stream s) const { return total_[Index(s)]; }
  uint64_t evicted_bytes(protocol::Stream s) const { return evicted_[Index(s)]; }
  size_t budget() const { return budget_; }

 private:
  static size_t Index(protocol::Stream s) { return s == protocol::Stream::kStderr ? 1 : 0; }
  bool OverBudget() const;
  bool EvictFront();
  bool Trim();
  // AppendOutput's rule: `n` more bytes of `stream` go into the newest event.
  bool MergesIntoTail(protocol::Stream stream, size_t n) const;

  size_t budget_;
  size_t merge_up_to_;
  std::deque<LogEvent> events_;
  std::shared_ptr<OutputBytes> reserved_;  // ReserveOutput's new buffer, until committed
  size_t reserved_room_ = 0;               // what ReserveOutput returned (0: nothing)
  protocol::Stream reserved_stream_ = protocol::Stream::kStdout;
  uint64_t sealed_ = 0;
  uint64_t first_id_ = 1;
  uint64_t delivered_ = 0;
  uint64_t exit_id_ = 0;
  size_t retained_[2] = {0, 0};
  uint64_t total_[2] = {0, 0};
  uint64_t evicted_[2] = {0, 0};
};

}  // namespace sbx::agent
