// SandboxService: the lifecycle of sandboxes, their operations and command sessions. It owns
// the rules (which transitions are allowed, who may see what, idempotency) and drives the
// runtimes through durable operations on the OperationEngine. It knows neither HTTP nor
// syscalls.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "ops/operation_engine.h"
#include "protocol/limits.h"
#include "runtime/backend.h"
#include "common/ticker.h"
#include "net/denial_log.h"
#include "net/profiles.h"
#include "service/activity.h"
#include "service/admission.h"
#include "service/agent_client.h"
#include "service/attach_token.h"
#include "service/build_step.h"
#include "service/cluster.h"
#include "service/inputs.h"
#include "service/job_waiters.h"
#include "service/reply_gate.h"
#include "service/results.h"
#include "service/sandbox_state.h"
#include "service/service_metrics.h"
#include "service/warm_pool.h"
#include "service/templates.h"
#include "store/store.h"

namespace sbx::service {

// How often the timers ask agents about sessions whose exit nobody watched: the longest that
// sbx_sessions_active and sbx_oom_kills_total lag behind them.
inline constexpr std::chrono::seconds kSessionRefresh{5};

// Server-side timers (timers.cc). A create without timeout_s gets default_timeout_s (0: no
// TTL); without idle_suspend_s, default_idle_suspend_s (0: never suspended for idleness). The
// retentions say how long records are kept: idempotency keys (replays of a retried call), and
// deleted sandboxes with their operations and sessions (GET still answers for them until then).
struct TimerSettings {
  int64_t default_timeout_s = 0;
  int64_t default_idle_suspend_s = 6 * 3600;
  std::chrono::seconds idempotency_retention{24 * 3600};
  std::chrono::seconds deleted_retention{7 * 24 * 3600};
};

struct ServiceOptions {
  std::string default_runtime = "ns";
  // This process's node (node.name, docs/scale.md): stamped on the sandboxes it creates and the
  // operations it runs; the start-up reconcile and the timers look at these only.
  std::string node_name;
  // Whether the reconcile takes the rows of no node (from before schema 9): `--role all` only.
  bool claim_unassigned = true;
  // A cluster node: called before each create with its template reference and the caller's
  // template namespace, so the reference resolves as the shared store says now and its layers
  // are here (TemplateService::SyncFromCluster). Its error fails the create. Unset: one host.
  std::function<absl::Status(const std::string& ref, const std::string& ns)> sync_template;
  // Runtimes sbxd knows but this host cannot run, with the reason a create is told.
  std::map<std::string, std::string> unavailable_runtimes;
  // Applied where a request omits a resource; pids, open_files, tmp_mib and shm_mib are not
  // requestable and always come from here.
  runtime::Resources defaults;
  // The agent's per-stream output buffer (sbxd --output-buffer-bytes), reported in every
  // sandbox's effective_resources.
  int64_t output_buffer_bytes = protocol::kDefaultOutputBufferBytes;
  std::chrono::seconds attach_token_ttl{900};
  // The attach-token key ring, oldest first (AttachTokens::LoadOrCreateRing), and the file
  // RotateAttachKey keeps it in. No keys: one random key, in memory only (tests).
  std::vector<AttachTokens::Key> attach_keys;
  std::string attach_keys_file;
  // Sandboxes kept ready per runtime and template (warm_pool.h); a create with the default
  // resources is served from them.
  std::vector<WarmPoolConfig> warm_pools;
  TimerSettings timers;
  std::chrono::milliseconds timer_interval{1000};
  // Where the service's metrics go (docs/metrics.md); nullptr: metrics::Default().
  metrics::Registry* metrics = nullptr;
  // Admission control (admission.h). Without a probe nothing is refused: sbxd always sets one.
  AdmissionSettings admission;
  Admission::Probe host_capacity;
  // Guest-sized replies held at once (reply_gate.h).
  ReplyGateSettings guest_replies;
  // Egress profiles offered (net/profiles.h); nullptr: networking is off and only `none` is.
  std::shared_ptr<const net::ProfileCatalog> egress_catalog;
  // A networked sandbox's denials by reason (NetworkHost::Denials); unset: none counted.
  std::function<absl::StatusOr<std::map<std::string, uint64_t>>(const std::string& id)>
      egress_denials;
  // Applies a PATCH of a running sandbox's allow rules (NetworkHost::PatchAllow: live nft
  // rules, open flows they forbid cut); answers the flows cut. Unset: networking is off.
  std::function<absl::StatusOr<int>(const std::string& id, const std::string& profile,
                                    const std::vector<net::EgressRule>& allow)>
      egress_patch;
  // A networked sandbox's recent denials, oldest first (NetworkHost::denials_log()).
  std::function<std::vector<net::Denial>(const std::string& id)> egress_recent_denials;
};

// What sbxd's configuration reload (SIGHUP) can change while sandboxes run. Everything else in
// ServiceOptions is fixed for the life of the service.
struct LiveOptions {
  runtime::Resources defaults;  // for sandboxes created from now on
  TimerSettings timers;
  std::chrono::seconds attach_token_ttl = ServiceOptions{}.attach_token_ttl;
  // The pools wanted now; a pool missing here is turned off.
  std::vector<WarmPoolConfig> warm_pools;
  AdmissionSettings admission;
};


class SandboxService {
 public:
  SandboxService(ServiceOptions opts, store::Store& store, ops::OperationEngine& engine,
                 TemplateRegistry templates, std::map<std::string, runtime::Backend*> backends);

  // Start-up: re-adopts running sandboxes, fails what a crash interrupted, re-drives deletes and
  // sweeps kernel objects that no stored sandbox owns.
  absl::Status Reconcile();
  bool ready() const;
  // After this node was fenced (cluster.h): destroys every instance whose sandbox the store no
  // longer gives this node (lost, deleted, or another node's). Returns how many.
  int ReleaseUnowned();
  // What this node's heartbeat reports (cluster.h): capacity, load, runtimes, templates, pools.
  NodeReport Report() const;
  // Starts filling the warm pools; call after Reconcile (its sweep would take pooled sandboxes
  // for leftovers). Stopped and emptied when the service is destroyed.
  void StartWarmPools();
  // Starts the timers: TTL deletes, idle suspension, retention purges (timers.cc). Call after
  // Reconcile. Stopped when the service is destroyed.
  void StartTimers();
  // One pass of the timers at the given clocks (what the timer thread runs; tests call it).
  void RunTimersOnce(std::chrono::system_clock::time_point wall,
                     ActivityTracker::Clock::time_point mono);
  // Data-plane activity the API sees (attach streams) keeps sandboxes from idling.
  ActivityTracker& activity() { return activity_; }
  // Slots for "processes" and "list" replies, which a guest sizes (reply_gate.h).
  ReplyGate& guest_replies() { return guest_replies_; }
  // Ready sandboxes per "runtime/template".
  std::map<std::string, int> WarmPoolReady() const { return pool_->Ready(); }
  // The size each pool is kept at, per "runtime/template".
  std::map<std::string, int> WarmPoolSizes() const { return pool_->Sizes(); }
  // Templates (TemplateService): a tag moved or went, so pooled sandboxes of the old release
  // go (the refill builds the new one); the releases pooled sandboxes are built from.
  void TemplateChanged();
  // What a pooled sandbox of `t` must match to be handed out: its digest, and its start
  // command when it has one (a re-import of the release may change that alone).
  static std::string Revision(const runtime::TemplateSpec& t);
  // What a create of `ref` would run (its spec), or why not (sbxd's start-up checks pools).
  absl::StatusOr<runtime::TemplateSpec> ResolveTemplate(const std::string& ref) const {
    return templates_.Resolve(ref);
  }
  // The release `sb` was made from (fixed at its create): the defaults of what is done in it
  // (workdir, default user, env). FailedPrecondition once that release left the store.
  absl::StatusOr<runtime::TemplateSpec> PinnedTemplate(const store::SandboxRecord& sb) const {
    return templates_.ResolvePinned(sb.template_ref, sb.template_digest);
  }
  std::map<std::string, int> PooledDigests() const { return pool_->Digests(); }
  // The host's capacity as admission sees it now, and what sandboxes hold of it.
  Admission::Snapshot AdmissionSnapshot() const { return admission_->Read(); }

  // Applies `live` to what happens from now on (sandboxes already created keep their limits).
  // Every warm pool's template and runtime is checked first: on error nothing changes.
  absl::Status Reconfigure(const LiveOptions& live);
  // The defaults applied to a new sandbox now.
  runtime::Resources defaults() const;
  TimerSettings timer_settings() const;

  // The state-changing calls answer typed results (results.h); `idem`: the request's
  // Idempotency-Key, if any.
  absl::StatusOr<Answer<SandboxCreated>> CreateSandbox(const Caller& caller,
                                                       const CreateSandboxRequest& req,
                                                       const std::optional<Idempotency>& idem);
  absl::StatusOr<store::SandboxRecord> GetSandbox(const Caller& caller, const std::string& id);
  // Egress (egress.cc): the profiles offered (GET /v1/egress-profiles), and one sandbox's
  // rules and denials by reason (GET /v1/sandboxes/{id}/egress).
  // The deployment's profiles that `caller`'s tenant may use (docs/tenancy.md).
  absl::StatusOr<nlohmann::json> EgressProfiles(const Caller& caller) const;
  // GET /v1/runtimes: every runtime this sbxd knows, whether this host can run it (and why
  // not), its capabilities and the resources a create gets by default.
  nlohmann::json Runtimes() const;
  absl::StatusOr<nlohmann::json> SandboxEgress(const Caller& caller, const std::string& id);
  // PATCH /v1/sandboxes/{id}/egress with {"allow": [rules]}: the running sandbox's allow
  // rules, within its profile's, live and stored; answers what SandboxEgress does plus
  // `connections_cut`. 400 naming the rule for a widening or `none`, 409 unless running.
  absl::StatusOr<nlohmann::json> PatchSandboxEgress(const Caller& caller, const std::string& id,
                                                    const nlohmann::json& body);
  // A create's egress_profile and egress, resolved: what the sandbox stores (null for `none`).
  // 400 naming the field for an unknown profile or a narrowing that widens it.
  absl::StatusOr<nlohmann::json> ResolveEgress(const CreateSandboxRequest& req) const;
  absl::StatusOr<store::Page<store::SandboxRecord>> ListSandboxes(
      const Caller& caller, store::SandboxFilter filter);
  absl::StatusOr<Answer<OperationStarted>> DeleteSandbox(const Caller& caller,
                                                         const std::string& id,
                                                         const std::optional<Idempotency>& idem);
  absl::StatusOr<store::OperationRecord> GetOperation(const Caller& caller, const std::string& id);
  // When the caller's sandbox `id` (or the sandbox of session `id`) was deleted because its
  // TTL ran out, and its record is still kept: the 410 sandbox_expired error, saying when and
  // why; OK otherwise. The router asks after a request on it failed.
  absl::Status ExpiredError(const Caller& caller, const std::string& id);
  // `kind` is "pause", "suspend" or "wake". The runtime must have Capabilities::pause
  // (not_implemented otherwise, before any change). pause/suspend need a running sandbox, wake
  // a paused or suspended one (invalid_state); another lifecycle operation in flight is
  // operation_in_progress, the same kind returns it (sandbox_state.h has the rules).
  absl::StatusOr<Answer<OperationStarted>> RequestLifecycle(
      const Caller& caller, const std::string& id, const std::string& kind,
      const std::optional<Idempotency>& idem);

  absl::StatusOr<Answer<SessionCreated>> CreateSession(const Caller& caller,
                                                       const std::string& sandbox_id,
                                                       const CreateSessionRequest& req,
                                                       const std::optional<Idempotency>& idem);
  absl::StatusOr<store::SessionRecord> GetSession(const Caller& caller, const std::string& id);
  // The agent of a sandbox the caller can see, for sandbox-wide agent calls (the process
  // list); sandbox_not_running when it is not running or frozen.
  absl::StatusOr<AgentClient> SandboxAgent(const Caller& caller, const std::string& sandbox_id);

  // A step of a template build (build_step.h, build_steps.cc): blocking, on the caller's
  // thread (TemplateService's operation worker).
  absl::StatusOr<BuildStepResult> RunBuildStep(const BuildStepRequest& req);

  // What an attach (and any session call) needs: the session, its spec, and the agent of its
  // running sandbox.
  struct AttachTarget {
    store::SessionRecord session;
    AgentClient agent;
    SessionSpec spec;
  };
  absl::StatusOr<AttachTarget> PrepareAttach(const Caller& caller, const std::string& session_id);
  // The agent's socket of a running sandbox; nullopt when the sandbox is not running, and
  // while it is frozen (paused, suspended, or a pause in progress): a frozen agent would leave
  // a caller waiting for its timeout.
  std::optional<std::string> AgentSocketFor(const std::string& sandbox_id) const;
  // The client of that agent (same conditions).
  std::optional<AgentClient> AgentFor(const std::string& sandbox_id);
  // A client of the agent at `sock` whose lost connections say what became of `sandbox_id`
  // (ExplainAgentLoss).
  AgentClient ClientFor(const std::string& sandbox_id, std::string sock);
  // `lost` (the agent stopped answering) as what happened to the sandbox meanwhile: 409
  // sandbox_not_running when it is no longer running, is being paused, suspended or deleted,
  // or its agent died (then marked failed); `lost` itself otherwise.
  absl::Status ExplainAgentLoss(const std::string& sandbox_id, absl::Status lost);
  // When the sandbox's agent has died (a kernel bug, a host OOM: nothing the guest does can
  // end it, src/agent/identity.h): marks the sandbox failed (code agent_lost, with how it
  // ended) and its unfinished sessions exited with error sandbox_failed, once, and returns
  // that message. nullopt while the agent lives (or the sandbox is not here), and while an
  // operation owns the sandbox (it sees the dead agent itself: a suspend stops a VMM on
  // purpose). The timers call
  // it every tick; a data-plane route whose agent connection broke calls it to say why.
  std::optional<std::string> CheckAgentLost(const std::string& sandbox_id);
  // Whether this process holds a runtime instance of the sandbox (it is not being deleted).
  bool HasInstance(const std::string& sandbox_id) const;
  // Record what the data plane observed.
  // `started`: the attach started the session's process (AttachStream::started()). `exit`:
  // the process was already over (AttachStream::ExitWithin): "running" and "exited" are then
  // one transaction, and the RecordSessionExit that follows for it costs none.
  void RecordSessionStarted(const std::string& session_id, bool started,
                            const std::optional<SessionExit>& exit = std::nullopt);
  void RecordSessionExit(const std::string& session_id, const SessionExit& ev);
  void RecordSessionStatus(const std::string& session_id, const SessionStatus& status);

  // Port exposure (ports.cc, api/port_routes.cc). Who may reach sandbox `sandbox_id`'s ports:
  // its owner's management token, its traffic token, or anyone when it was created with
  // public_ports. Returns the owner's tenant; not_found (also for another tenant's caller),
  // unauthenticated (no credential), permission_denied (a traffic token of another sandbox or
  // none at all), sandbox_not_running. A success counts as activity (no idle suspension).
  struct PortCredentials {
    std::optional<Caller> caller;              // from a valid management token
    std::optional<std::string> traffic_token;  // as the client sent it, unchecked
    // E2B's X-Access-Token (api/e2b): the sandbox's envd token opens its ports too (it can
    // run any process in it already); anything else is the application's own header.
    std::optional<std::string> envd_token;
  };
  absl::StatusOr<std::string> AuthorizePort(const std::string& sandbox_id,
                                            const PortCredentials& creds);
  // E2B's envd (api/e2b): the owner of running sandbox `sandbox_id` when `token` is its envd
  // token, as a caller that may run processes and touch files in it and nothing else;
  // unauthenticated without it or with another, not_found, sandbox_not_running. Counts as
  // activity. EnvdToken: the caller's sandbox's token, minted and stored when it has none (a
  // sandbox made before they existed).
  absl::StatusOr<Caller> AuthorizeEnvd(const std::string& sandbox_id,
                                       const std::optional<std::string>& token);
  absl::StatusOr<std::string> EnvdToken(const Caller& caller, const std::string& sandbox_id);
  // A new TTL that ends `seconds` from now (E2B's setTimeout, connect's timeout): timeout_s
  // becomes the sandbox's age plus `seconds` (1 s to 30 days). invalid_state once deleting.
  absl::StatusOr<store::SandboxRecord> SetTimeoutFromNow(const Caller& caller,
                                                         const std::string& id, int64_t seconds);
  // A socket connecting to the sandbox's loopback `port` (runtime::Instance::DialPort), made in
  // its network namespace; sandbox_not_running when it is not running or frozen.
  absl::StatusOr<UniqueFd> DialPort(const std::string& sandbox_id, uint16_t port,
                                    bool ipv6) const;

  const AttachTokens& attach_tokens() const { return tokens_; }
  // For what the router keeps beside the service's own rows (service/idempotency.h).
  store::Store& store() { return store_; }
  // POST /v1/admin/attach-keys:rotate: a new key signs attach tokens from now on; the one it
  // replaces still verifies for one token lifetime (AttachTokens::Rotate). Written to the
  // state dir before it takes effect.
  absl::StatusOr<AttachKeysView> RotateAttachKey();
  // GET /v1/admin/attach-keys: the ring, without its secrets.
  AttachKeysView AttachKeys() const { return tokens_.Keys(); }
  // Readers waiting for a sandbox's operations to move (keyed by sandbox id).
  JobWaiters& job_waiters() { return waiters_; }

 private:
  // `requested`: when the operation was accepted (or re-driven), for its duration metrics.
  using TimePoint = ServiceMetrics::Clock::time_point;

  // What a state-changing call did in its transaction (operations.cc), for after the commit.
  template <typename T>
  struct Accepted {
    T result;
    // The operation it started ("": none); its sandbox's state change is logged ("" from: a
    // new sandbox), with why.
    std::string op_id, sandbox_id, from, to, why;
    // Submitted on the sandbox's queue once committed; empty: nothing to run.
    std::function<void()> job;
  };
  // The skeleton of every state-changing call: in one transaction, the stored answer of a
  // repeated Idempotency-Key, or `fn`'s result, whose rendering is stored for the key; then
  // the state change logged and the job submitted. `fn` may run more than once (busy
  // retries), and not at all on a replay.
  template <typename T>
  absl::StatusOr<Answer<T>> Mutate(const Caller& caller, const std::optional<Idempotency>& idem,
                                   const std::string& body_hash,
                                   const std::function<absl::StatusOr<Accepted<T>>(store::Tx&)>& fn);

  // An operation's job, for its first and last steps.
  struct Job {
    std::string op_id, sandbox_id, kind;
    TimePoint requested;
    std::chrono::steady_clock::time_point started;
  };
  // Why a pending operation no longer applies to its sandbox, or nullopt.
  using CancelCheck = std::function<std::optional<std::string>(const store::OperationRecord&,
                                                               const store::SandboxRecord&)>;
  // The first step: pending -> running (logged "started"), or, when `cancelled` says why,
  // failed with code cancelled. Returns the sandbox when the job goes on. Without `cancelled`
  // the operation runs whatever its state (a delete re-driven after a restart).
  std::optional<store::SandboxRecord> BeginJob(const Job& job, const CancelCheck& cancelled);
  // Finishes the operation and moves the sandbox (`apply` returns whether it changed the
  // sandbox), in one transaction; then `committed` (what must follow the commit at once, such
  // as giving capacity back: a client may act on the operation as soon as it sees it
  // finished), the metrics and the state-change line. The finished operation, or the store's
  // error (logged).
  using FinishStep = std::function<absl::StatusOr<bool>(
      store::Tx&, store::OperationRecord& op, store::SandboxRecord& sb, const std::string& now)>;
  absl::StatusOr<store::OperationRecord> FinishJob(const Job& job, const FinishStep& apply,
                                                   const std::function<void()>& committed = {});
  // Every job goes to the engine through here: a job that throws (a bug, never a result) still
  // finishes its operation, failed with code internal, and leaves its sandbox failed when the
  // operation was the sandbox's current one, so no client polls a "running" operation forever
  // and the sandbox can be deleted.
  void SubmitJob(const std::string& op_id, const std::string& sandbox_id,
                 std::function<void()> job, log::Context lctx);
  void FailThrownJob(const std::string& op_id, const std::string& sandbox_id,
                     const std::string& what);

  // Delete and the lifecycle verbs: one request path, the rules in sandbox_state.h.
  absl::StatusOr<Answer<OperationStarted>> RequestOperation(
      const Caller& caller, const std::string& id, Verb verb,
      const std::optional<Idempotency>& idem);
  struct StartedOperation {
    store::OperationRecord op;
    bool is_new = false;  // false: the one in flight, or the one that already did it
  };
  // Within the request's transaction: checks `verb` against `sb` and records a new operation
  // (moving `sb`), or returns the operation that answers it.
  absl::StatusOr<StartedOperation> StartOperation(store::Tx& tx, const Caller& caller,
                                                  store::SandboxRecord& sb, Verb verb);
  // A new sandbox record for `req` (no id, resources or operation yet).
  store::SandboxRecord NewSandbox(const Caller& caller, const CreateSandboxRequest& req,
                                  const runtime::TemplateSpec& tmpl) const;
  // The create job's runtime call.
  absl::StatusOr<runtime::InstancePtr> BuildInstance(const store::SandboxRecord& sb);
  // Takes the instance out of instances_ and destroys it.
  void DropInstance(const std::string& sandbox_id);
  // Reconcile's steps (reconcile.cc). AdoptOnRestart: false when the sandbox is lost (its
  // error set).
  absl::StatusOr<bool> AdoptOnRestart(store::SandboxRecord& sb,
                                      const std::vector<store::OperationRecord>& unfinished);
  absl::Status FailInterrupted(std::vector<store::OperationRecord>& unfinished,
                               const std::set<std::string>& redriven);
  void RestoreActiveSessions(const std::vector<std::string>& adopted);
  void RestoreLedger(const std::vector<store::SandboxRecord>& live);

  void RunCreate(const std::string& op_id, const std::string& sandbox_id, TimePoint requested);
  void RunDelete(const std::string& op_id, const std::string& sandbox_id, TimePoint requested);
  void RunLifecycle(const std::string& op_id, const std::string& sandbox_id,
                    const std::string& kind, TimePoint requested);
  absl::StatusOr<runtime::Backend*> BackendFor(const std::string& name) const;
  // The runtime of a template build that names none: the default when it can build, else ns.
  std::string BuildRuntime() const;
  // The spec fields of tty, stdin and timeout_s sessions (protocol/messages.h).
  static void AddInteractiveSpec(const CreateSessionRequest& req, SessionSpec& spec);
  // Destroys whatever the runtime still holds for a sandbox (instance in memory, or adopted).
  absl::Status DestroyRuntime(const store::SandboxRecord& sb);
  // Asks the sandbox's agent about each session the store has as running and records what it
  // says: the store learns of an exit only when a client is attached or asks; the agent knows.
  // Whether a session process still runs; nullopt when that cannot be known (store error, no
  // agent, or the agent did not answer).
  std::optional<bool> RefreshRunningSessions(const std::string& sandbox_id);
  // Asks the agents of running sandboxes about the sessions the store thinks still run, so
  // exits nobody watched reach the store and the metrics (timers.cc).
  void RefreshSessionStates(const std::vector<store::SandboxRecord>& live);
  // CheckAgentLost for every sandbox whose agent is not alive (timers.cc).
  void CheckAgentsAlive();
  // Reads each live sandbox's denied-egress counter into sbx_egress_denied_total (timers.cc).
  void RefreshDeniedEgress(const std::vector<store::SandboxRecord>& live);
  // One sandbox's reading, if it has an instance here and its runtime counts.
  void ReadDeniedEgress(const std::string& sandbox_id, bool baseline);
  absl::StatusOr<store::SandboxRecord> VisibleSandbox(store::Tx& tx, const Caller& caller,
                                                      const std::string& id);
  // The same with its tenant's row, in one read where the store can (a session create).
  absl::StatusOr<store::SandboxAndTenant> VisibleSandboxAndTenant(store::Tx& tx,
                                                                  const Caller& caller,
                                                                  const std::string& id);

  // sbx_sandboxes and the warm pool gauges: read at scrape time from the store and the pool.
  void RegisterMetricCallbacks();

  absl::StatusOr<WarmSandbox> BuildWarm(const WarmPoolConfig& config);
  // Gives a sandbox's resources back to admission and lets a waiting warm pool try again.
  void ReleaseCapacity(const std::string& sandbox_id);
  // A pooled sandbox that can serve `req` as requested with `defaults`, or nullopt. `egress`:
  // the create's resolved egress (null: `none`); a networked one is served by a network-ready
  // member, given `egress` here (Instance::AttachEgress), or by none when that fails.
  std::optional<WarmSandbox> TakeWarm(const Caller& caller, const CreateSandboxRequest& req,
                                      const runtime::Resources& defaults, const nlohmann::json& egress);

  ServiceOptions opts_;  // opts_.defaults is the start-up value only: see defaults_
  store::Store& store_;
  ops::OperationEngine& engine_;
  TemplateRegistry templates_;
  std::map<std::string, runtime::Backend*> backends_;
  AttachTokens tokens_;
  JobWaiters waiters_;

  // Its own lock: read by every create and sandbox view, written by Reconfigure only.
  mutable std::mutex defaults_mu_;
  runtime::Resources defaults_;
  TimerSettings timer_settings_;

  mutable std::mutex mu_;
  std::mutex egress_patch_mu_;  // one PATCH of egress rules at a time (live rules, then store)
  // Sessions just created, until their first PrepareAttach (sessions.cc): the record as the
  // store holds it, so that create + attach reads the store once, not twice.
  struct JustCreated {
    store::SessionRecord record;
    SessionSpec spec;
  };
  std::mutex just_created_mu_;
  std::map<std::string, JustCreated> just_created_;
  std::optional<JustCreated> TakeJustCreated(const std::string& session_id);
  // Sessions whose exit this process committed (guarded by just_created_mu_): an exit is
  // final, so another report of it (the attach that relays it, a second client) needs no
  // transaction. Bounded: a session not here is looked up in the store as before.
  std::set<std::string> exits_recorded_;
  std::map<std::string, runtime::InstancePtr> instances_;  // running sandboxes, by id
  std::set<std::string> frozen_;  // ids whose instance is frozen or being frozen
  // Who may reach a running sandbox's ports (ports.cc), as its record says: fixed at create, so
  // read from the store once instead of on every proxied request; under mu_, and dropped with
  // the instance (EraseInstance).
  struct PortAccess {
    std::string tenant_id;
    bool is_public = false;
    std::string token_sha256;  // hex; empty: none
    std::string envd_sha256;   // of the envd token (api/e2b); empty: none
  };
  // A sandbox's access as cached for a running one, else from its record (`state` then set to
  // the record's state; empty when cached).
  absl::StatusOr<PortAccess> AccessOf(const std::string& sandbox_id, std::string& state);
  absl::Status CheckRunningAndCache(const std::string& sandbox_id, const PortAccess& access,
                                    std::string state);
  std::map<std::string, PortAccess> port_access_;
  // Takes sandbox `id`'s instance out of instances_ (under mu_), with what is cached beside it.
  runtime::InstancePtr EraseInstanceLocked(const std::string& id);
  bool ready_ = false;
  ActivityTracker activity_;
  ReplyGate guest_replies_;
  std::chrono::system_clock::time_point last_purge_{};
  std::chrono::system_clock::time_point last_session_refresh_{};
  std::unique_ptr<ServiceMetrics> metrics_;
  // The ledger of held resources. Outlives the pool, which releases its members into it.
  std::unique_ptr<Admission> admission_;
  // Destroyed right after the timers and the metric callbacks below and before everything
  // else, while the backends and templates it uses still exist.
  std::unique_ptr<WarmPool> pool_;
  // Unregistered before the pool goes, so that no scrape reads the store or the pool during
  // teardown.
  std::vector<metrics::CallbackHandle> metric_callbacks_;
  // Last member: stopped first. Its passes call the service like a client (store, engine,
  // backends, pool, metrics).
  std::unique_ptr<Ticker> timers_;
};

}  // namespace sbx::service
