// The service layer's metrics (docs/metrics.md), recorded where the service learns the fact:
// after the store transaction that finished an operation or moved a session has committed.
// Every child a hot path touches is looked up once here, so recording is a few relaxed atomic
// adds; only session starts and ends take a lock (once per session, never per output chunk).
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "store/store.h"

namespace sbx::service {

// An operation's outcome as the metrics name it: "succeeded", "failed", or "cancelled" (a
// failed operation whose error code is "cancelled": a delete overtook it).
std::string_view OperationResult(const store::OperationRecord& op);

class ServiceMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  // `runtimes`: the backends' names, known up front so that their children exist from the
  // first scrape and are found without a lock.
  ServiceMetrics(metrics::Registry& registry, const std::vector<std::string>& runtimes,
                 const std::string& default_runtime);

  metrics::Registry& registry() { return registry_; }

  // An operation the service finished (its row is committed as succeeded or failed).
  // `requested`: when it was accepted (or re-driven); nullopt when this process does not know
  // (failed at start-up after a crash): counted, but no duration is observed.
  void OperationFinished(const store::OperationRecord& op,
                         std::optional<Clock::time_point> requested);
  // A create that reached running: `warm` when a pooled sandbox served it.
  void SandboxRunning(const std::string& runtime, bool warm, Clock::time_point requested);

  // Sessions: the caller reports each transition once, after the store transaction that made
  // it (the stored state is what makes a repeat a no-op). A session's process started
  // (created -> running, or created -> exited when the start was never recorded); `count_start`
  // is false for a running session re-adopted after a restart.
  void SessionStarted(const std::string& session_id, bool count_start = true);
  // A session went to exited (its process exited, or it ended with its sandbox). The active
  // gauge ignores ids it does not hold (a session of a sandbox lost across a restart).
  void SessionExited(const std::string& session_id, bool oom_killed);

  // Denied egress: `counts` is a sandbox's counters by reason as read now
  // (Instance::DeniedEgress), each of which only grows while the sandbox lives. The sandbox's
  // series move by what was added since its previous reading (the first reading of a sandbox
  // this process created counts from 0). `baseline` records a reading without counting it: a
  // sandbox adopted after a restart, whose earlier refusals the previous process counted.
  void EgressReading(const std::string& sandbox_id, const std::map<std::string, uint64_t>& counts,
                     bool baseline = false);
  // The sandbox is gone (after its final reading): its series stay kEgressLinger more, so that
  // every scraper reads the last count, then DropGoneEgress drops them.
  static constexpr std::chrono::minutes kEgressLinger{5};
  void ForgetEgress(const std::string& sandbox_id, Clock::time_point now = Clock::now());
  void DropGoneEgress(Clock::time_point now);

 private:
  metrics::Registry& registry_;
  static constexpr std::array<std::string_view, 5> kKinds = {"create", "delete", "pause",
                                                             "suspend", "wake"};
  static constexpr std::array<std::string_view, 3> kResults = {"succeeded", "failed",
                                                               "cancelled"};
  metrics::Family<metrics::Counter>& ops_family_;
  metrics::Family<metrics::Histogram>& op_duration_family_;
  std::array<std::array<metrics::Counter*, kResults.size()>, kKinds.size()> ops_{};
  std::array<metrics::Histogram*, kKinds.size()> op_duration_{};
  // runtime -> {cold, warm}; fixed after construction, read without a lock.
  metrics::Family<metrics::Histogram>& create_to_running_family_;
  std::map<std::string, std::array<metrics::Histogram*, 2>, std::less<>> create_to_running_;

  metrics::Counter& sessions_started_;
  metrics::Gauge& sessions_active_;
  metrics::Counter& oom_kills_;
  std::mutex sessions_mu_;
  std::set<std::string, std::less<>> active_sessions_;

  struct EgressSeries {
    std::map<std::string, uint64_t> seen;   // reason -> last reading
    std::map<std::string, uint64_t> total;  // reason -> counted (only reasons that moved)
    std::optional<Clock::time_point> gone;  // when ForgetEgress was told
  };
  std::mutex egress_mu_;
  std::map<std::string, EgressSeries, std::less<>> egress_;  // by sandbox id
  // Last: unregistered first, while egress_ is still there for a scrape running it.
  metrics::CallbackHandle egress_denied_;
};

}  // namespace sbx::service
