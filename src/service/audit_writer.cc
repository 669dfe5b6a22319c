#include "service/audit_writer.h"

#include <spdlog/spdlog.h>

#include <string>
#include <utility>

namespace sbx::service {

AuditWriter::~AuditWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AuditWriter::Add(store::AuditRecord rec) {
  std::unique_lock lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  done_.wait(lock, [&] { return queue_.size() < kMaxQueued; });
  queue_.push_back(std::move(rec));
  ++added_;
  lock.unlock();
  work_.notify_one();
}

void AuditWriter::Flush() {
  std::unique_lock lock(mu_);
  const uint64_t target = added_;
  if (written_ >= target) return;
  ++flushing_;
  lock.unlock();
  work_.notify_one();  // ends a linger
  lock.lock();
  done_.wait(lock, [&] { return written_ >= target; });
  --flushing_;
}

void AuditWriter::Run() {
  std::deque<store::AuditRecord> batch;
  std::unique_lock lock(mu_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything is written
    // Company for the first line: more lines, until the batch is full, a Flush waits or sbxd
    // stops.
    work_.wait_for(lock, kLinger,
                   [&] { return stop_ || flushing_ > 0 || queue_.size() >= kMaxBatch; });
    while (!queue_.empty() && batch.size() < kMaxBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    lock.unlock();
    done_.notify_all();  // room in the queue
    const size_t n = batch.size();
    const bool stored = Write(batch);
    lock.lock();
    written_ += n;
    if (!stored && stop_) {
      // A stopping sbxd does not wait on a store that refuses (each try may take a connect
      // timeout): the rest goes to the log only, each line saying so.
      batch.swap(queue_);
      const size_t rest = batch.size();
      lock.unlock();
      LogLines(batch, absl::UnavailableError("the store refused the lines before; sbxd is stopping"));
      batch.clear();
      lock.lock();
      written_ += rest;
    }
    done_.notify_all();
  }
}

bool AuditWriter::Write(std::deque<store::AuditRecord>& batch) {
  absl::Status st = store_.Transact([&](store::Tx& tx) -> absl::Status {
    for (const store::AuditRecord& rec : batch) {
      if (absl::Status s = tx.AddAudit(rec); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
  LogLines(batch, st);
  batch.clear();
  return st.ok();
}

void AuditWriter::LogLines(const std::deque<store::AuditRecord>& batch, const absl::Status& st) {
  // The log line carries the row as its fields, so a log pipeline has the trail too.
  for (const store::AuditRecord& rec : batch) {
    spdlog::info("audit: {} {} target={} status={} code={} tenant={} token={} request={}{}",
                 rec.action, rec.status < 400 ? "ok" : "refused", rec.target, rec.status,
                 rec.code, rec.tenant_id, rec.token_id, rec.request_id,
                 st.ok() ? "" : " (not stored: " + std::string(st.message()) + ")");
  }
}

}  // namespace sbx::service
