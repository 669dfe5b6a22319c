#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/digest.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/service_internal.h"
#include "service/tenancy.h"
#include "service/sandbox_service.h"
#include "service/sandbox_state.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

// ---------------------------------------------------------------------------------------------
// Sessions

absl::StatusOr<Answer<SessionCreated>> SandboxService::CreateSession(
    const Caller& caller, const std::string& sandbox_id, const CreateSessionRequest& req,
    const std::optional<Idempotency>& idem) {
  std::optional<JustCreated> created;
  auto answer = Mutate<SessionCreated>(caller, idem, Sha256Hex(req.canonical.dump()),
                                [&](Tx& tx) -> absl::StatusOr<Accepted<SessionCreated>> {
    // One read for both (a round trip on PostgreSQL): the sandbox, and the quota's tenant row.
    SBX_ASSIGN_OR_RETURN(store::SandboxAndTenant both,
                         VisibleSandboxAndTenant(tx, caller, sandbox_id));
    const SandboxRecord& sb = both.sandbox;
    if (sb.state != kRunning) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                      fmt::format("sandbox {} is {}, not running", sb.id, sb.state));
    }
    SBX_RETURN_IF_ERROR(CheckSessionQuota(tx, both.tenant, sb.id));
    const std::string now = NowRfc3339();
    SessionRecord s;
    s.id = NewId("ses");
    s.tenant_id = caller.tenant_id;
    s.sandbox_id = sb.id;
    s.state = "created";
    // The template's workdir and user are the defaults, as for the files API (the agent's
    // --workdir); a template removed since the sandbox was made leaves "/" and root.
    auto tmpl = templates_.ResolvePinned(sb.template_ref, sb.template_digest);
    SessionSpec spec;
    spec.argv = req.argv;
    spec.cwd = req.cwd.value_or(tmpl.ok() ? tmpl->workdir : "/");
    spec.user = req.user.value_or(tmpl.ok() ? tmpl->default_user : "root");
    // The image's Env under the sandbox's, under the session's: a sandbox from the warm pool
    // was started before its env was known, so the agent's own environment cannot carry it.
    if (tmpl.ok()) {
      for (const std::string& kv : tmpl->env) {
        const size_t eq = kv.find('=');
        if (eq != std::string::npos && eq > 0) spec.env[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    }
    if (sb.env.is_object()) {
      for (const auto& [k, v] : sb.env.items()) {
        if (v.is_string()) spec.env[k] = v.get<std::string>();
      }
    }
    for (const auto& [k, v] : req.env) spec.env[k] = v;
    AddInteractiveSpec(req, spec);
    // Stored as the agent reads it (protocol/messages.h): PrepareAttach decodes it back.
    s.spec = spec.ToJson();
    s.created_at = now;
    SBX_RETURN_IF_ERROR(tx.PutSession(s));
    created = JustCreated{s, std::move(spec)};  // a retried transaction overwrites it
    Accepted<SessionCreated> out;
    out.result = SessionCreated{s, tokens_.Mint(s.id, caller.tenant_id)};
    return out;
  });
  // Only what was committed (a replayed answer created nothing now).
  if (answer.ok() && answer->result && created && created->record.id == answer->result->session.id) {
    std::lock_guard lock(just_created_mu_);
    // Sessions nobody attaches to would pile up: the store answers for them instead.
    if (just_created_.size() >= 1024) just_created_.clear();
    just_created_.emplace(created->record.id, std::move(*created));
  }
  return answer;
}

std::optional<SandboxService::JustCreated> SandboxService::TakeJustCreated(
    const std::string& session_id) {
  std::lock_guard lock(just_created_mu_);
  auto it = just_created_.find(session_id);
  if (it == just_created_.end()) return std::nullopt;
  JustCreated out = std::move(it->second);
  just_created_.erase(it);
  return out;
}

void SandboxService::AddInteractiveSpec(const CreateSessionRequest& req, SessionSpec& spec) {
  // Only what was asked for: the spec of a plain session stays what it always was.
  if (req.tty) {
    spec.tty = TtySize{static_cast<uint16_t>(req.tty_rows.value_or(24)),
                       static_cast<uint16_t>(req.tty_cols.value_or(80))};
  }
  spec.stdin_pipe = req.stdin_open || req.tty;
  if (req.timeout_s) spec.timeout_s = static_cast<uint64_t>(*req.timeout_s);
  if (req.kill_grace_s) spec.kill_grace_s = static_cast<uint64_t>(*req.kill_grace_s);
}

absl::StatusOr<AgentClient> SandboxService::SandboxAgent(const Caller& caller,
                                                         const std::string& sandbox_id) {
  SBX_ASSIGN_OR_RETURN(SandboxRecord sb, GetSandbox(caller, sandbox_id));
  auto sock = AgentSocketFor(sb.id);
  if (!sock) {
    const std::string state = sb.state == kRunning ? "being paused" : sb.state;
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is {}, not running", sb.id, state));
  }
  return ClientFor(sb.id, *sock);
}

absl::StatusOr<SessionRecord> SandboxService::GetSession(const Caller& caller,
                                                         const std::string& id) {
  if (!IsValidId(id, "ses")) return BadId("session", id);
  if (caller.session_scope && *caller.session_scope != id) return NotFound("session", id);
  SessionRecord out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(out, VisibleRow(tx.GetSession(id), [&](const SessionRecord& r) {
                           return r.tenant_id == caller.tenant_id;
                         }, "session", id));
    return absl::OkStatus();
  }));
  if (caller.initiator == "api") activity_.Touch(out.sandbox_id);
  return out;
}

absl::StatusOr<SandboxService::AttachTarget> SandboxService::PrepareAttach(
    const Caller& caller, const std::string& session_id) {
  // The first attach after create: the record is the one just committed, and nothing changes a
  // "created" row while its sandbox's agent is reachable (a delete or a lost agent removes that
  // first, a pause freezes it). Otherwise, and after a restart, the store answers as before.
  if (auto just = TakeJustCreated(session_id);
      just && just->record.tenant_id == caller.tenant_id &&
      (!caller.session_scope || *caller.session_scope == session_id)) {
    if (auto sock = AgentSocketFor(just->record.sandbox_id)) {
      if (caller.initiator == "api") activity_.Touch(just->record.sandbox_id);
      AgentClient agent = ClientFor(just->record.sandbox_id, *sock);
      return AttachTarget{std::move(just->record), std::move(agent), std::move(just->spec)};
    }
  }
  SBX_ASSIGN_OR_RETURN(SessionRecord s, GetSession(caller, session_id));
  auto sock = AgentSocketFor(s.sandbox_id);
  if (!sock) {
    SandboxRecord sb;
    (void)store_.Transact([&](Tx& tx) -> absl::Status {
      auto r = tx.GetSandbox(s.sandbox_id);
      if (r.ok()) sb = *r;
      return absl::OkStatus();
    });
    if (auto lost = CheckAgentLost(s.sandbox_id)) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                      fmt::format("sandbox {} is failed: {}", s.sandbox_id, *lost));
    }
    // Running in the store but without a socket: a pause is freezing it right now.
    std::string state = sb.state.empty() ? "gone" : sb.state == kRunning ? "being paused" : sb.state;
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is {}, not running{}", s.sandbox_id, state,
                                sb.error.is_object() ? fmt::format(": {}", sb.error.value("message", "")) : ""));
  }
  // The spec as CreateSession wrote it; one that no longer decodes is a store edited by hand,
  // which the agent would refuse the same way.
  SBX_ASSIGN_OR_RETURN(SessionSpec spec, SessionSpec::FromJson(s.spec));
  AgentClient agent = ClientFor(s.sandbox_id, *sock);
  return AttachTarget{std::move(s), std::move(agent), std::move(spec)};
}

std::optional<AgentClient> SandboxService::AgentFor(const std::string& sandbox_id) {
  auto sock = AgentSocketFor(sandbox_id);
  if (!sock) return std::nullopt;
  return ClientFor(sandbox_id, *sock);
}

AgentClient SandboxService::ClientFor(const std::string& sandbox_id, std::string sock) {
  AgentClient agent = AgentClient::ForSocket(std::move(sock));
  agent.set_explainer([this, sandbox_id](absl::Status lost) {
    return ExplainAgentLoss(sandbox_id, std::move(lost));
  });
  return agent;
}

absl::Status SandboxService::ExplainAgentLoss(const std::string& sandbox_id, absl::Status lost) {
  if (auto dead = CheckAgentLost(sandbox_id)) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} is failed: {}", sandbox_id, *dead));
  }
  SandboxRecord sb;
  (void)store_.Transact([&](Tx& tx) -> absl::Status {
    auto r = tx.GetSandbox(sandbox_id);
    if (r.ok()) sb = *r;
    return absl::OkStatus();
  });
  const bool frozen = [&] {
    std::lock_guard lock(mu_);
    return frozen_.count(sandbox_id) > 0;
  }();
  std::string state;
  if (sb.state.empty()) {
    state = "gone";
  } else if (sb.state != kRunning) {
    state = sb.state;
  } else if (frozen) {
    state = "being paused";
  } else if (sb.current_operation_id) {
    state = fmt::format("being changed by operation {}", *sb.current_operation_id);
  } else {
    return lost;  // running as far as sbxd knows: the agent's own trouble, retried by the caller
  }
  return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                  fmt::format("sandbox {} is {}, not running (its agent stopped answering "
                              "during the request: {})",
                              sandbox_id, state, std::string(lost.message())));
}

std::optional<std::string> SandboxService::AgentSocketFor(const std::string& sandbox_id) const {
  std::lock_guard lock(mu_);
  auto it = instances_.find(sandbox_id);
  // A dead agent's socket would only refuse: the caller says "not running" instead, at once.
  if (it == instances_.end() || frozen_.count(sandbox_id) || !it->second->Alive()) return std::nullopt;
  return it->second->AgentSocketPath();
}

std::optional<std::string> SandboxService::CheckAgentLost(const std::string& sandbox_id) {
  std::string reason;
  {
    std::lock_guard lock(mu_);
    auto it = instances_.find(sandbox_id);
    if (it == instances_.end() || it->second->Alive()) return std::nullopt;
    reason = it->second->DeathReason();
  }
  const std::string message = fmt::format(
      "the sandbox's agent (PID 1) is gone ({}); the kernel ended every process of the sandbox "
      "with it, and their unread output is lost; delete the sandbox", reason);
  std::string from;
  std::vector<std::string> ended;  // sessions that were running
  bool in_flight = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    from.clear();
    ended.clear();
    SBX_ASSIGN_OR_RETURN(SandboxRecord sb, tx.GetSandbox(sandbox_id));
    // An operation in flight (a delete above all) owns the sandbox: it sees the dead agent
    // itself, and the next tick looks again once it is done.
    in_flight = sb.current_operation_id.has_value();
    if (in_flight || !(sb.state == kRunning || IsFrozenState(sb.state))) {
      return absl::OkStatus();
    }
    const std::string now = NowRfc3339();
    from = sb.state;
    sb.state = std::string(kFailed);
    sb.error = {{"code", "agent_lost"}, {"message", message}};
    sb.updated_at = now;
    SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
    SBX_ASSIGN_OR_RETURN(std::vector<SessionRecord> sessions, tx.ListSessions(sandbox_id));
    for (SessionRecord& s : sessions) {
      if (s.state == "exited") continue;
      if (s.state == "running") {
        ended.push_back(s.id);
        s.signal = "SIGKILL";  // what the kernel sends a pid namespace whose init died
      }
      s.state = "exited";
      s.exited_at = now;
      s.error = {{"code", "sandbox_failed"}, {"message", message}};
      SBX_RETURN_IF_ERROR(tx.PutSession(s));
    }
    return absl::OkStatus();
  });
  if (!st.ok()) {
    spdlog::warn("sandbox {}: agent lost, but marking it failed did not commit: {}", sandbox_id,
                 std::string(st.message()));
    return message;
  }
  // The operation decides (a suspend that stops the VMM on purpose, a delete): whoever asked
  // is told nothing failed, since nothing has, yet.
  if (in_flight) return std::nullopt;
  if (!from.empty()) {
    {
      std::lock_guard lock(mu_);
      frozen_.erase(sandbox_id);
    }
    log::Context lctx;
    lctx.sandbox = sandbox_id;
    log::Scope scope(lctx);
    log::Event(spdlog::level::warn, {{"reason", reason}}, "sandbox {}: agent lost: {}", sandbox_id, reason);
    LogStateChange(sandbox_id, from, kFailed, message);
    for (const std::string& id : ended) metrics_->SessionExited(id, /*oom_killed=*/false);
  }
  return message;
}

bool SandboxService::HasInstance(const std::string& sandbox_id) const {
  std::lock_guard lock(mu_);
  return instances_.count(sandbox_id) > 0;
}

void SandboxService::CheckAgentsAlive() {
  std::vector<std::string> dead;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, inst] : instances_) {
      if (!inst->Alive()) dead.push_back(id);
    }
  }
  for (const std::string& id : dead) (void)CheckAgentLost(id);
}

void SandboxService::RecordSessionStarted(const std::string& session_id, bool started_now,
                                          const std::optional<SessionExit>& exit) {
  if (!started_now) return;
  // Over already (an exec of a short command): one transaction from "created" to "exited",
  // committed before the attaching client gets a byte, as "running" would have been.
  if (exit) return RecordSessionExit(session_id, *exit);
  bool started = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    started = false;
    SBX_ASSIGN_OR_RETURN(SessionRecord s, tx.GetSession(session_id));
    if (s.state != "created") return absl::OkStatus();
    s.state = "running";
    s.started_at = NowRfc3339();
    started = true;
    return tx.PutSession(s);
  });
  if (st.ok() && started) metrics_->SessionStarted(session_id);
  if (!st.ok()) spdlog::warn("session {}: {}", session_id, std::string(st.message()));
}

void SandboxService::RecordSessionExit(const std::string& session_id, const SessionExit& ev) {
  {
    std::lock_guard lock(just_created_mu_);
    if (exits_recorded_.erase(session_id) > 0) return;  // committed by this process already
  }
  std::string was;  // the state this call moved the session from to exited
  store::SessionEnd end;
  end.exit_code = ev.exit_code;
  end.signal = ev.signal;
  end.timed_out = ev.timed_out;
  end.oom_killed = ev.oom_killed;
  end.at = NowRfc3339();
  auto ended = store_.EndSession(session_id, end);
  absl::Status st = ended.status();
  if (ended.ok()) was = *std::move(ended);
  if (st.ok() && !was.empty()) {
    if (was == "created") metrics_->SessionStarted(session_id);  // its start went unrecorded
    metrics_->SessionExited(session_id, ev.oom_killed);
    // The attach that relays this exit reports it next; one more attached client at most
    // after that finds the store already saying "exited" (hence erase on the first hit).
    std::lock_guard lock(just_created_mu_);
    if (exits_recorded_.size() >= 1024) exits_recorded_.clear();
    exits_recorded_.insert(session_id);
  }
  if (!st.ok()) spdlog::warn("session {}: {}", session_id, std::string(st.message()));
}

void SandboxService::RecordSessionStatus(const std::string& session_id,
                                         const SessionStatus& status) {
  const std::string& state = status.state;
  if (state != "running" && state != "exited") return;
  std::string was;  // the state this call moved the session from
  bool oom_killed = false;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    was.clear();
    SBX_ASSIGN_OR_RETURN(SessionRecord s, tx.GetSession(session_id));
    if (s.state == "exited" || s.state == state) return absl::OkStatus();
    was = s.state;
    s.state = state;
    if (status.started_at) s.started_at = *status.started_at;
    if (state == "exited") {
      if (status.exit_code) s.exit_code = *status.exit_code;
      if (status.signal) s.signal = *status.signal;
      s.oom_killed = status.oom_killed;
      s.timed_out = status.timed_out;
      s.exited_at = status.exited_at.value_or(NowRfc3339());
    }
    oom_killed = s.oom_killed;
    return tx.PutSession(s);
  });
  if (st.ok() && !was.empty()) {
    if (was == "created") metrics_->SessionStarted(session_id);
    if (state == "exited") metrics_->SessionExited(session_id, oom_killed);
  }
  if (!st.ok()) spdlog::warn("session {}: {}", session_id, std::string(st.message()));
}

absl::StatusOr<AttachKeysView> SandboxService::RotateAttachKey() {
  auto rotated = tokens_.Rotate(std::chrono::system_clock::now());
  if (!rotated.ok()) {
    spdlog::warn("attach keys: rotation failed: {}", std::string(rotated.status().message()));
    return rotated.status();
  }
  spdlog::info("attach keys: {} signs from now on; {} key(s) in the ring",
               rotated->signing_key_id, rotated->keys.size());
  return rotated;
}

}  // namespace sbx::service
