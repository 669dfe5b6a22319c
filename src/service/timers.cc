// The server's own clock-driven work, one pass per tick:
//   - Agents: a sandbox whose agent died is marked failed (CheckAgentLost), within a tick.
//   - TTL: a sandbox whose created_at + timeout_s has passed is deleted (initiator "ttl").
//   - Idle: a running sandbox unused for idle_suspend_s is suspended (initiator "idle"): no
//     management call, no attach stream, and no session process running. Processes started in
//     the background do not keep it awake, as in SPACE.
//   - Sessions: a session whose process exited while no client was attached stays "running"
//     in the store (and in sbx_sessions_active, its OOM kill uncounted) until someone asks;
//     every kSessionRefresh the agents of running sandboxes are asked about those sessions.
//   - Denied egress: every kSessionRefresh each live sandbox's counters by reason are read
//     into sbx_egress_denied_total{sandbox,reason} (and a last time just before a delete
//     destroys the sandbox, whose series go ServiceMetrics::kEgressLinger later).
//   - Retention: idempotency keys and deleted sandboxes older than their retention are purged,
//     once a minute.
// Everything goes through the same calls as the API, so the operation history, the per-sandbox
// ordering and the state checks are the same as for a client's request.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/agent_client.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"

namespace sbx::service {

using store::SandboxRecord;
using store::Tx;

void SandboxService::StartTimers() {
  if (timers_) return;
  timers_ = std::make_unique<Ticker>(opts_.timer_interval, [this] {
    RunTimersOnce(std::chrono::system_clock::now(), ActivityTracker::Clock::now());
  });
}


std::optional<bool> SandboxService::RefreshRunningSessions(const std::string& sandbox_id) {
  std::vector<std::string> running;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    auto sessions = tx.ListSessions(sandbox_id);
    if (!sessions.ok()) return sessions.status();
    running.clear();
    for (const auto& s : *sessions) {
      if (s.state == "running") running.push_back(s.id);
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return std::nullopt;
  if (running.empty()) return false;
  auto sock = AgentSocketFor(sandbox_id);
  if (!sock) return std::nullopt;
  bool any = false;
  for (const std::string& id : running) {
    auto status = AgentClient::ForSocket(*sock).StatusBlocking(id);
    if (!status.ok()) return std::nullopt;  // busy or gone: the next round asks again
    RecordSessionStatus(id, *status);
    if (status->state != "exited") any = true;
  }
  return any;
}

void SandboxService::RefreshSessionStates(const std::vector<SandboxRecord>& live) {
  for (const SandboxRecord& sb : live) {
    // A frozen agent cannot answer, and one in the middle of an operation may be going away.
    if (sb.state != kRunning || sb.current_operation_id) continue;
    (void)RefreshRunningSessions(sb.id);
  }
}

void SandboxService::ReadDeniedEgress(const std::string& sandbox_id, bool baseline) {
  // Held for two small procfs reads and the recording: a delete removes the instance, then
  // forgets the sandbox's readings, so no reading lands after that and counts it all again.
  std::lock_guard lock(mu_);
  auto it = instances_.find(sandbox_id);
  if (it == instances_.end()) return;
  auto n = it->second->DeniedEgress();
  if (n.ok()) {
    metrics_->EgressReading(sandbox_id, *n, baseline);
  } else if (!absl::IsUnimplemented(n.status())) {
    spdlog::debug("sandbox {}: {}", sandbox_id, std::string(n.status().message()));
  }
}

void SandboxService::RefreshDeniedEgress(const std::vector<SandboxRecord>& live) {
  for (const SandboxRecord& sb : live) ReadDeniedEgress(sb.id, /*baseline=*/false);
}

void SandboxService::RunTimersOnce(std::chrono::system_clock::time_point wall,
                                   ActivityTracker::Clock::time_point mono) {
  // First: a sandbox whose agent died must not be reported running for longer than a tick.
  CheckAgentsAlive();
  std::vector<SandboxRecord> live;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    auto all = tx.ListLiveSandboxes(opts_.node_name);
    if (!all.ok()) return all.status();
    live = std::move(*all);
    return absl::OkStatus();
  });
  if (!st.ok()) {
    spdlog::warn("timers: list sandboxes: {}", std::string(st.message()));
    live.clear();
  }
  for (const SandboxRecord& sb : live) {
    if (sb.state == kDeleting || sb.state == kDeleted) continue;
    log::Context lctx;
    lctx.tenant = sb.tenant_id;
    lctx.sandbox = sb.id;
    log::Scope scope(lctx);
    Caller system{sb.tenant_id, std::nullopt, ""};
    if (sb.timeout_s) {
      auto created = ParseRfc3339(sb.created_at);
      if (created && wall >= *created + std::chrono::seconds(*sb.timeout_s)) {
        system.initiator = "ttl";
        auto r = DeleteSandbox(system, sb.id, std::nullopt);
        if (r.ok()) {
          spdlog::info("sandbox {}: TTL of {} s reached; deleting", sb.id, *sb.timeout_s);
        } else {
          spdlog::warn("sandbox {}: TTL delete: {}", sb.id, std::string(r.status().message()));
        }
        continue;
      }
    }
    const int64_t idle_s = sb.idle_suspend_s.value_or(timer_settings().default_idle_suspend_s);
    if (idle_s <= 0 || sb.state != kRunning || sb.current_operation_id) continue;
    auto idle = activity_.IdleFor(sb.id, mono);
    if (!idle || *idle < std::chrono::seconds(idle_s)) continue;
    auto backend = BackendFor(sb.runtime);
    if (!backend.ok() || !(*backend)->GetCapabilities().pause) continue;
    if (RefreshRunningSessions(sb.id).value_or(true)) continue;  // unknown: never on a guess
    system.initiator = "idle";
    auto r = RequestLifecycle(system, sb.id, "suspend", std::nullopt);
    if (r.ok()) {
      spdlog::info("sandbox {}: idle for {} s; suspending", sb.id, idle_s);
    } else {
      // A client's call may have raced us (invalid_state): the next tick looks again.
      spdlog::debug("sandbox {}: idle suspend: {}", sb.id, std::string(r.status().message()));
    }
  }

  if (wall - last_session_refresh_ >= kSessionRefresh) {
    last_session_refresh_ = wall;
    RefreshSessionStates(live);
    RefreshDeniedEgress(live);
    metrics_->DropGoneEgress(mono);
  }

  if (wall - last_purge_ < std::chrono::minutes(1)) return;
  last_purge_ = wall;
  int64_t keys = 0, sandboxes = 0;
  const TimerSettings timers = timer_settings();
  st = store_.Transact([&](Tx& tx) -> absl::Status {
    auto k = tx.PurgeIdempotency(FormatRfc3339(wall - timers.idempotency_retention));
    if (!k.ok()) return k.status();
    auto d = tx.PurgeDeletedSandboxes(FormatRfc3339(wall - timers.deleted_retention));
    if (!d.ok()) return d.status();
    keys = *k;
    sandboxes = *d;
    return absl::OkStatus();
  });
  if (!st.ok()) {
    spdlog::warn("timers: retention purge: {}", std::string(st.message()));
  } else if (keys > 0 || sandboxes > 0) {
    spdlog::info("retention: purged {} idempotency keys and {} deleted sandboxes", keys,
                 sandboxes);
  }
}

absl::StatusOr<SandboxRecord> SandboxService::SetTimeoutFromNow(const Caller& caller,
                                                              const std::string& id,
                                                              int64_t seconds) {
  constexpr int64_t kMaxTimeout = 30LL * 86400;
  if (seconds < 1 || seconds > kMaxTimeout) {
    return FieldError("timeout", fmt::format("must be 1 to {} seconds", kMaxTimeout));
  }
  SandboxRecord out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(out, VisibleSandbox(tx, caller, id));
    if (out.state == kDeleted || out.state == kDeleting) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "invalid_state",
                      fmt::format("sandbox {} is {}", id, out.state));
    }
    // The TTL counts from created_at (timers above): the new one is the age plus `seconds`.
    const auto now = std::chrono::system_clock::now();
    const auto created = ParseRfc3339(out.created_at).value_or(now);
    const int64_t age =
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::seconds>(now - created).count());
    out.timeout_s = age + seconds;
    out.updated_at = FormatRfc3339(now);
    return tx.PutSandbox(out);
  }));
  return out;
}

}  // namespace sbx::service
