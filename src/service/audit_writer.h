// Audit lines written after the answer, off the request's path (docs/tenancy.md, "Audit log").
//
// A request's audit line is a store transaction of its own, and it used to run on the HTTP
// thread after the answer, before the connection read its next request: a round trip to
// PostgreSQL (an fcntl-locked WAL write on SQLite) on every change a client makes, and a
// stall of every other connection on that thread. The writer takes the lines instead, and
// a thread of its own commits what has piled up in one transaction (one round trip for many
// lines under load). A line that arrives alone waits up to kLinger for company: a client that
// changes things one request at a time (an exec loop, a create/delete cycle) would otherwise
// cost a wake-up of this thread and a commit per request. Nothing is dropped: Add waits while
// the queue is full, and the destructor commits what is left; only a store that refuses while
// sbxd stops is not waited on again (the remaining lines go to the log alone, marked "not
// stored"). Flush waits until every line added before it is committed, so a listing through
// this process sees its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "store/store.h"

namespace sbx::service {

class AuditWriter {
 public:
  // At most this many lines wait; more make Add wait for the writer.
  static constexpr size_t kMaxQueued = 4096;
  // Lines per transaction at most.
  static constexpr size_t kMaxBatch = 256;
  // How long the first line of a batch waits for more before it is committed. Flush and the
  // destructor do not wait for it.
  static constexpr std::chrono::milliseconds kLinger{20};

  explicit AuditWriter(store::Store& store) : store_(store) {}
  ~AuditWriter();
  AuditWriter(const AuditWriter&) = delete;
  AuditWriter& operator=(const AuditWriter&) = delete;

  // Queues one line (its time set by the caller); starts the writer's thread on first use.
  void Add(store::AuditRecord rec);
  // Returns once every line added before the call is committed (or its failure logged).
  void Flush();

 private:
  void Run();
  // Commits `batch` in one transaction and logs each line (with the store's error, if any);
  // false if the store refused it.
  bool Write(std::deque<store::AuditRecord>& batch);
  static void LogLines(const std::deque<store::AuditRecord>& batch, const absl::Status& st);

  store::Store& store_;
  std::mutex mu_;
  std::condition_variable work_;  // the writer: lines, or stop
  std::condition_variable done_;  // Add (room) and Flush (written_ moved)
  std::deque<store::AuditRecord> queue_;
  uint64_t added_ = 0;
  uint64_t written_ = 0;
  int flushing_ = 0;  // Flush calls waiting: the writer commits without lingering
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sbx::service
