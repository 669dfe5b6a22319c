// Reaper: removes the files of destroyed sandboxes after their delete has finished, so that
// `deleted` waits only for what makes a sandbox unreachable (its processes dead, its cgroups and
// uid range gone), not for ext4 to free a disk image's extents and a directory tree's inodes
// (measured 30-150 ms of a delete on the project's machine under load, docs/isolation.md §6.1).
//
// A queued path keeps its name, `<state>/sandboxes/<id>`: a crash before the reaper gets to it
// leaves a directory of an id the store no longer counts live, which the start-up sweep removes
// (§6.2). The thread runs at nice 19 (not SCHED_IDLE: it must make progress on a busy host) and
// takes the whole queue at once. A removal that fails is logged and retried with backoff (0.5 s
// doubling to 30 s), never dropped. The queue is bounded: when it is full Defer() refuses and the
// caller removes inline, so a host too busy for the reaper slows deletes down instead of filling
// its disk with images.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

class Reaper {
 public:
  using RemoveFn = std::function<absl::Status(const std::string& path)>;

  // `max_backlog` > 0: paths queued and not yet removed, at most. `remove` defaults to
  // RemoveTree (fsutil.h); tests pass their own. `first_retry`: the first backoff.
  explicit Reaper(size_t max_backlog, RemoveFn remove = {},
                  std::chrono::milliseconds first_retry = std::chrono::milliseconds(500));
  // Stops the thread, then tries once more every path still queued (at the caller's priority);
  // what still fails is logged and left to the next start-up sweep.
  ~Reaper();
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  // Queues `path` for removal. `hold`, if valid, is closed just before: a reference to the
  // destroyed sandbox's root whose last close unmounts its overlay and disk (see Destroy in
  // ns_instance.cc). False when the backlog is full: nothing was queued (`hold` is closed
  // here) and the caller removes the path itself.
  bool Defer(std::string path, UniqueFd hold = {});

  // Paths queued or being retried.
  size_t pending() const;
  // Removals that failed (each retry counts), since construction.
  uint64_t failures() const;
  // Until nothing is pending or `timeout` passed; true when nothing is pending.
  bool WaitIdle(std::chrono::milliseconds timeout) const;

 private:
  struct Item {
    std::string path;
    UniqueFd hold;
    int attempts = 0;
    std::chrono::steady_clock::time_point due{};
  };

  void Loop();
  // One attempt; false (logged, attempts counted) on failure.
  bool Attempt(Item& item);

  const size_t max_backlog_;
  const RemoveFn remove_;
  const std::chrono::milliseconds first_retry_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;       // the thread waits for work here
  mutable std::condition_variable idle_cv_;  // WaitIdle waits here
  std::deque<Item> queue_;
  size_t in_flight_ = 0;  // taken by the thread and not yet removed or re-queued
  uint64_t failures_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // started by the first Defer
};

}  // namespace sbx::runtime::ns
