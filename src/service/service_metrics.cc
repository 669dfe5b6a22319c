#include "service/service_metrics.h"

#include <algorithm>

#include "common/build_info.h"

namespace sbx::service {
namespace {

// Lifecycle operations run from about a millisecond (a warm create, a wake) to tens of
// seconds (a delete waiting on a stuck sandbox).
const std::vector<double> kOperationBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,    1,     2.5,  5,     10,   30, 60};
// The headline latency: a warm create takes about a millisecond, a cold one about ten, so the
// buckets are fine-grained from 0.5 to 100 ms.
const std::vector<double> kCreateToRunningBuckets = {
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02,
    0.025,  0.03,  0.04,   0.05,  0.075, 0.1,   0.25,  0.5,    1,    2.5,    5,     10};

}  // namespace

std::string_view OperationResult(const store::OperationRecord& op) {
  if (op.state == "succeeded") return "succeeded";
  if (op.error.is_object() && op.error.value("code", "") == "cancelled") return "cancelled";
  return "failed";
}

ServiceMetrics::ServiceMetrics(metrics::Registry& registry,
                               const std::vector<std::string>& runtimes,
                               const std::string& default_runtime)
    : registry_(registry),
      ops_family_(registry.AddCounter(
          "sbx_operations_total",
          "Lifecycle operations finished, by kind and result (succeeded, failed, or cancelled "
          "when a delete overtook them).",
          {"kind", "result"})),
      op_duration_family_(registry.AddHistogram(
          "sbx_operation_duration_seconds",
          "Time from accepting a lifecycle operation to finishing it, whatever the result.",
          {"kind"}, kOperationBuckets)),
      create_to_running_family_(registry.AddHistogram(
          "sbx_sandbox_create_to_running_seconds",
          "Time from a create request to the sandbox running, by runtime and source (warm: "
          "served from the warm pool; cold: launched for the request).",
          {"runtime", "source"}, kCreateToRunningBuckets)),
      sessions_started_(registry
                            .AddCounter("sbx_sessions_started_total",
                                        "Command sessions whose process started.")
                            .WithLabels()),
      sessions_active_(registry
                           .AddGauge("sbx_sessions_active",
                                     "Command sessions whose process is running (paused "
                                     "sandboxes included).")
                           .WithLabels()),
      oom_kills_(registry
                     .AddCounter("sbx_oom_kills_total",
                                 "Command sessions that ended killed by the out-of-memory "
                                 "killer of their sandbox's memory limit.")
                     .WithLabels()) {
  // A callback rather than a family: a family's children live as long as the registry, and a
  // deleted sandbox's series must go (one series per sandbox and reason would otherwise pile up
  // for the life of sbxd).
  egress_denied_ = registry.AddCallback(
      "sbx_egress_denied_total",
      "What sandboxes tried to reach and their egress profile refused, by sandbox and reason "
      "(the reasons of GET /v1/sandboxes/{id}/egress; no_route: profile none): packets counted "
      "by the kernel, and names and connections refused by sbxd's resolver and proxy. Read "
      "every 5 s and at delete; a deleted sandbox's series go 5 minutes after the delete.",
      metrics::Type::kCounter, {"sandbox", "reason"}, [this](metrics::CallbackSamples& out) {
        std::lock_guard lock(egress_mu_);
        for (const auto& [id, series] : egress_) {
          for (const auto& [reason, n] : series.total) {
            out.Add({id, reason}, static_cast<double>(n));
          }
        }
      });
  for (size_t k = 0; k < kKinds.size(); ++k) {
    for (size_t r = 0; r < kResults.size(); ++r) {
      ops_[k][r] = &ops_family_.WithLabels({kKinds[k], kResults[r]});
    }
    op_duration_[k] = &op_duration_family_.WithLabels({kKinds[k]});
  }
  for (const std::string& rt : runtimes) {
    create_to_running_[rt] = {&create_to_running_family_.WithLabels({rt, "cold"}),
                              &create_to_running_family_.WithLabels({rt, "warm"})};
  }
  registry
      .AddGauge("sbx_build_info",
                "Always 1: the version and git commit of this sbxd, and its default runtime.",
                {"version", "commit", "runtime"})
      .WithLabels({BuildVersion(), BuildCommit(), default_runtime})
      .Set(1);
}

void ServiceMetrics::OperationFinished(const store::OperationRecord& op,
                                       std::optional<Clock::time_point> requested) {
  const std::string_view result = OperationResult(op);
  size_t k = 0;
  while (k < kKinds.size() && kKinds[k] != op.kind) ++k;
  size_t r = 0;
  while (r < kResults.size() && kResults[r] != result) ++r;
  const std::optional<Clock::duration> took =
      requested ? std::optional(Clock::now() - *requested) : std::nullopt;
  if (k == kKinds.size()) {
    // A kind added without a child here: still counted, through the family's lookup.
    ops_family_.WithLabels({op.kind, result}).Inc();
    if (took) op_duration_family_.WithLabels({op.kind}).ObserveDuration(*took);
    return;
  }
  ops_[k][r]->Inc();
  if (took) op_duration_[k]->ObserveDuration(*took);
}

void ServiceMetrics::SandboxRunning(const std::string& runtime, bool warm,
                                    Clock::time_point requested) {
  const Clock::duration took = Clock::now() - requested;
  auto it = create_to_running_.find(runtime);
  if (it == create_to_running_.end()) {
    create_to_running_family_.WithLabels({runtime, warm ? "warm" : "cold"}).ObserveDuration(took);
    return;
  }
  it->second[warm ? 1 : 0]->ObserveDuration(took);
}

void ServiceMetrics::SessionStarted(const std::string& session_id, bool count_start) {
  if (count_start) sessions_started_.Inc();
  std::lock_guard lock(sessions_mu_);
  active_sessions_.insert(session_id);
  sessions_active_.Set(static_cast<double>(active_sessions_.size()));
}

void ServiceMetrics::SessionExited(const std::string& session_id, bool oom_killed) {
  if (oom_killed) oom_kills_.Inc();
  std::lock_guard lock(sessions_mu_);
  active_sessions_.erase(session_id);
  sessions_active_.Set(static_cast<double>(active_sessions_.size()));
}

void ServiceMetrics::EgressReading(const std::string& sandbox_id,
                                   const std::map<std::string, uint64_t>& counts, bool baseline) {
  std::lock_guard lock(egress_mu_);
  EgressSeries& series = egress_[sandbox_id];
  for (const auto& [reason, count] : counts) {
    uint64_t& last = series.seen[reason];
    // Smaller than before only if the runtime gave the sandbox a new namespace: all of it is new.
    const uint64_t added = count >= last ? count - last : count;
    last = count;
    if (!baseline && added > 0) series.total[reason] += added;
  }
}

void ServiceMetrics::ForgetEgress(const std::string& sandbox_id, Clock::time_point now) {
  std::lock_guard lock(egress_mu_);
  auto it = egress_.find(sandbox_id);
  if (it == egress_.end()) return;
  // Never read or counted: nothing for a scraper to see.
  if (it->second.total.empty()) {
    egress_.erase(it);
  } else if (!it->second.gone) {
    it->second.gone = now;
  }
}

void ServiceMetrics::DropGoneEgress(Clock::time_point now) {
  std::lock_guard lock(egress_mu_);
  std::erase_if(egress_, [now](const auto& e) {
    return e.second.gone && now - *e.second.gone >= kEgressLinger;
  });
}

}  // namespace sbx::service
