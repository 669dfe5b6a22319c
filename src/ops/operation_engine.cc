#include "ops/operation_engine.h"

#include <spdlog/spdlog.h>

namespace sbx::ops {

OperationEngine::OperationEngine(int workers) {
  for (int i = 0; i < std::max(1, workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

OperationEngine::~OperationEngine() { Shutdown(); }

void OperationEngine::Submit(const std::string& key, std::function<void()> job,
                             log::Context log_ctx) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      SBX_LOG_WARN(log_ctx, "operation engine is stopping; job for {} dropped", key);
      return;
    }
    auto& q = queues_[key];
    q.push_back(Job{std::move(job), std::move(log_ctx)});
    ++pending_;
    if (q.size() == 1 && !running_[key]) ready_.push_back(key);
  }
  cv_.notify_one();
}

size_t OperationEngine::pending() const {
  std::lock_guard lock(mu_);
  return pending_;
}

void OperationEngine::Shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

void OperationEngine::SetJobDoneHook(std::function<void(const std::string& key)> hook) {
  std::lock_guard lock(mu_);
  job_done_ = std::move(hook);
}

void OperationEngine::WorkerLoop() {
  for (;;) {
    Job job;
    std::string key;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return !ready_.empty() || (stopping_ && pending_ == 0); });
      if (ready_.empty()) return;
      key = std::move(ready_.front());
      ready_.pop_front();
      auto& q = queues_[key];
      job = std::move(q.front());
      q.pop_front();
      running_[key] = true;
    }
    {
      log::Scope scope(job.log_ctx);
      try {
        job.run();
      } catch (const std::exception& e) {
        // Jobs report errors through the store; an exception here is a bug, not a result.
        spdlog::error("operation job for {} threw: {}", key, e.what());
      }
      if (job_done_) job_done_(key);
    }
    {
      std::lock_guard lock(mu_);
      running_.erase(key);
      --pending_;
      auto it = queues_.find(key);
      if (it != queues_.end() && !it->second.empty()) {
        ready_.push_back(key);
      } else if (it != queues_.end()) {
        queues_.erase(it);
      }
    }
    cv_.notify_all();
  }
}

}  // namespace sbx::ops
