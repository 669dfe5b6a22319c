// OperationEngine runs lifecycle work (create, delete, ...) on worker threads so that HTTP
// handlers never block on runtime work. Jobs that share a key (the sandbox id) run one at a
// time, in submission order: a delete submitted while a create runs starts after it, which is
// how "delete wins" stays race-free. Jobs with different keys run in parallel.
//
// The operation's row in the store is the truth clients poll; the engine itself keeps nothing
// durable. After a restart the service re-submits unfinished operations.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"

namespace sbx::ops {

class OperationEngine {
 public:
  explicit OperationEngine(int workers);
  ~OperationEngine();  // finishes queued jobs, then joins

  // `log_ctx` is in scope (log::Scope) on the worker while the job runs: every line logged
  // there, the runtime's included, names the operation, its sandbox and tenant.
  void Submit(const std::string& key, std::function<void()> job, log::Context log_ctx = {});
  // Called on the worker thread after every job, with the job's key, once the job's own store
  // commits are done: lets long-polling readers re-read instead of polling. Set it before the
  // first Submit; it must not call back into the engine.
  void SetJobDoneHook(std::function<void(const std::string& key)> hook);
  // Stops accepting jobs, runs what is queued, joins the workers.
  void Shutdown();
  // Jobs queued or running (for /readyz and tests).
  size_t pending() const;

 private:
  void WorkerLoop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    std::function<void()> run;
    log::Context log_ctx;
  };
  std::map<std::string, std::deque<Job>> queues_;  // per key
  std::deque<std::string> ready_;  // keys with queued jobs and no running job
  std::map<std::string, bool> running_;
  size_t pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::function<void(const std::string&)> job_done_;
};

}  // namespace sbx::ops
