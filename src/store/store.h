// Store: the durable truth of sbxd. Sandboxes, operations, sessions, idempotency keys, templates,
// tenants, tokens and the audit log are rows; every state change happens inside Transact(), so
// a crash leaves either the whole change or none of it. Output never goes through the store (it
// lives in the agents' buffers).
//
// Implementations: SqliteStore (embedded default, WAL; transactions serialized) and PgStore
// (PostgreSQL, for several sbxd on one database; SERIALIZABLE transactions from a connection
// pool). store/open_store.h picks one by URL.
//
// Thread safety: a Store is safe for concurrent use.
//
// Usage:
//   SBX_RETURN_IF_ERROR(store.Transact([&](Tx& tx) -> absl::Status {
//     SBX_ASSIGN_OR_RETURN(SandboxRecord sb, tx.GetSandbox(id));
//     sb.state = "deleting";
//     return tx.PutSandbox(sb);
//   }));
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::store {

using Json = nlohmann::json;

struct SandboxRecord {
  std::string id;         // "sbx_..."
  std::string tenant_id;  // "ten_..." or "default"
  std::string state;      // creating | running | paused | suspended | deleting | deleted | failed
                          // (service/sandbox_state.h)
  std::string template_ref;     // as requested, e.g. "base" or "base:latest"
  std::string template_digest;  // resolved at create, never re-resolved
  std::string runtime;          // "ns", "fake", ...
  Json resources = Json::object();            // as requested; null where omitted
  Json effective_resources = Json::object();  // after defaults
  std::string egress_profile;
  Json env = Json::object();
  Json labels = Json::object();
  std::optional<int64_t> timeout_s;       // TTL: deleted this long after created_at
  std::optional<int64_t> idle_suspend_s;  // null: the deployment default; 0: never
  std::string created_at;  // RFC 3339
  std::string updated_at;
  std::optional<std::string> current_operation_id;
  Json error = nullptr;          // null, or {"code": ..., "message": ...}
  Json runtime_state = nullptr;  // what the backend needs to Adopt() the sandbox after a restart
  // net::ResolvedEgress::ToJson() of a networked sandbox, as resolved at create; null: `none`.
  Json egress = nullptr;
  // Port exposure (api/port_routes.cc): {"traffic_token": "stt1....", "public": bool}, set at
  // create; null for a sandbox created before schema 5 (reachable with a management token only).
  Json port_access = nullptr;
  // The node (sbxd --node-name) whose runtime holds the sandbox; "" for a row written before
  // schema 9, which only a `--role all` sbxd claims (Tx::ClaimUnassigned).
  std::string node;
};

struct OperationRecord {
  std::string id;  // "op_..."
  std::string tenant_id;
  std::string kind;  // create | delete | pause | suspend | wake
  std::string sandbox_id;
  std::string state;  // pending | running | succeeded | failed
  Json error = nullptr;
  Json result = nullptr;
  std::string created_at;
  std::string updated_at;
  std::optional<std::string> completed_at;
  std::string initiator = "api";  // api | ttl | idle (the server's own timers)
  // A template operation (kind template_import | template_pull) has no sandbox (sandbox_id
  // ""): `target` names the template it makes ("name:tag"), `progress` is its last snapshot
  // ({stage, layers_done, layers_total, bytes_done, bytes_total}); null for sandbox operations.
  std::string target;
  Json progress = nullptr;
  // The node whose process runs the operation (its jobs are in that process's memory); "" as
  // for SandboxRecord::node.
  std::string node;
};

// A template release: one image whose layers are in the layer store (image/image.h), named by
// its manifest digest. Tags (TagRecord) point at releases; sandboxes keep the digest they were
// created from.
struct ImageRecord {
  std::string digest;  // "sha256:<hex>"
  std::string name;    // the template name it was made under (name@digest resolves by it)
  Json layers = Json::array();   // [{"diff_id", "unpacked_bytes", "entries"}], bottom first
  Json config = Json::object();  // {env, entrypoint, cmd, working_dir, user, labels, os, architecture}
  Json source = Json::object();  // {"kind": "import"} | {"kind": "pull", "image": "<ref>"}
  int64_t size = 0;              // unpacked bytes of its layers
  std::string created_at;
};

struct TagRecord {
  std::string name;
  std::string tag;
  std::string digest;
  std::string updated_at;
};

struct SessionRecord {
  std::string id;  // "ses_..."
  std::string tenant_id;
  std::string sandbox_id;
  std::string state;  // created | running | exited
  Json spec = Json::object();  // {argv, cwd, env, user, tty, stdin, timeout_s}
  std::optional<int> exit_code;
  std::optional<std::string> signal;  // "SIGKILL"
  bool timed_out = false;
  bool oom_killed = false;
  std::string created_at;
  std::optional<std::string> started_at;
  std::optional<std::string> exited_at;
  // {code, message} when the session ended without an exit of its own (its sandbox's agent
  // died); null otherwise.
  Json error = nullptr;
};

// What ends a session with an exit of its own (Tx::EndSession).
struct SessionEnd {
  std::optional<int> exit_code;
  std::optional<std::string> signal;
  bool timed_out = false;
  bool oom_killed = false;
  std::string at;  // RFC 3339: exited_at, and started_at if it was never set
};

struct IdempotencyRecord {
  std::string tenant_id;
  std::string key;
  std::string method;  // "POST"
  std::string route;   // route template, e.g. "/v1/sandboxes"
  std::string body_hash;
  int status = 0;
  std::string response_body;
  std::string created_at;
};

// A tenant (issue 18): the owner of sandboxes, templates and tokens. Schema 7 inserts "default",
// which holds everything made before tenancy.
struct TenantRecord {
  std::string id;                // "ten_<20 base32>" or "default"
  std::string name;
  std::string state = "active";  // active | deleting
  // {"max_sandboxes", "max_vcpu", "max_memory_mib", "max_disk_mib", "max_sessions_per_sandbox",
  // "max_templates", "max_template_bytes"}; a key absent = unlimited. Not interpreted here.
  Json quotas = Json::object();
  Json rate_limit = Json::object();  // {"requests_per_s", "burst"}; not interpreted here
  // ["name", ...]: the egress profiles its sandboxes and builds may use (besides `none`);
  // null: every profile of the deployment. Not interpreted here.
  Json egress_profiles = nullptr;
  std::string created_at;            // RFC 3339
  std::string updated_at;
};

struct SandboxAndTenant {
  SandboxRecord sandbox;
  std::optional<TenantRecord> tenant;  // nullopt: the sandbox's tenant has no row
};

// A management token. The store keeps its hash only, never the token itself.
struct TokenRecord {
  std::string id;  // "tok_<20 base32>"
  std::string tenant_id;
  std::string name;
  std::string hash;                // "sha256:<hex>" of the whole token string
  Json scopes = Json::array();     // ["read", "sandboxes", ...]
  std::optional<std::string> expires_at;
  std::string created_at;
  std::optional<std::string> revoked_at;
};

// One line of the audit log. The log is append-only: rows are never updated or deleted.
struct AuditRecord {
  int64_t seq = 0;        // assigned by AppendAudit (monotonic, 1-based, never reused)
  std::string time;       // RFC 3339 with milliseconds
  std::string tenant_id;  // the caller's tenant
  std::string token_id;   // "tok_...", "bootstrap" (the configured admin token) or "" (none)
  std::string action;     // e.g. "POST /v1/sandboxes"
  std::string target;     // the object acted on ("sbx_...", "ten_...", "tok_...", "name:tag") or ""
  int status = 0;         // HTTP status answered
  std::string code;       // API error code, "" on success
  std::string request_id;
};

struct AuditFilter {
  std::optional<std::string> tenant_id;
  // RFC 3339; "" = from the start. Compared as text: every time is UTC "Z" in one format.
  std::string since;
  int64_t after_seq = 0;  // paging: only rows with seq > after_seq
  int limit = 100;        // clamped to 1..1000
};

// What a tenant's sandboxes hold, for its quotas. A sandbox in state deleted or failed holds
// nothing; a suspended one holds only its disk; every other state (creating, running, paused,
// deleting, ...) holds everything. Summed from effective_resources (keys vcpu, memory_mib,
// disk_mib; integers; a missing key counts 0).
struct TenantUsage {
  int64_t sandboxes = 0;  // not deleted/failed, suspended included
  int64_t vcpu = 0;
  int64_t memory_mib = 0;
  int64_t disk_mib = 0;
};

// A node of a cluster (docs/scale.md): one sbxd with runtimes, registered and kept alive by its
// heartbeat. `epoch` is the node's lease: it grows by one at each registration and when the node
// is declared lost, so a node that finds a different epoch than its own knows it was fenced.
struct NodeRecord {
  std::string name;
  std::string url;    // how api replicas reach its HTTP API, e.g. "http://10.0.0.5:7070"
  std::string role;   // node | all
  std::string state;  // active | draining | lost
  int64_t epoch = 0;
  std::string heartbeat_at;  // RFC 3339 with milliseconds
  std::string started_at;
  Json capacity = Json::object();  // service::NodeCapacity as JSON (placement.h)
  Json load = Json::object();      // {sandboxes, vcpu, memory_mib, disk_mib} it holds
  Json labels = Json::object();
  std::string reason;  // why it is draining or lost; "" when active
  // RFC 3339: a node stopped on purpose (SIGTERM: a rolling restart) is back by then. Until
  // then it is not declared lost and nothing is placed on it; "" while it runs (schema 10).
  std::string restart_by;
};

struct SandboxFilter {
  std::string tenant_id;
  std::optional<std::string> state;
  std::optional<std::pair<std::string, std::string>> label;  // key, value
  bool include_deleted = false;
  int limit = 50;
  std::string page_token;  // opaque; empty for the first page
};

template <typename T>
struct Page {
  std::vector<T> items;
  std::optional<std::string> next_page_token;
};

// One transaction. Getters return NotFound when the row does not exist. Put* are upserts.
class Tx {
 public:
  virtual ~Tx() = default;

  virtual absl::StatusOr<SandboxRecord> GetSandbox(const std::string& id) = 0;
  // The sandbox and its tenant's row (nullopt: the tenant has none), which a session create
  // reads both of. PostgreSQL answers them in one round trip; this default reads one, then
  // the other.
  virtual absl::StatusOr<SandboxAndTenant> GetSandboxAndTenant(const std::string& id) {
    SandboxAndTenant out;
    auto sb = GetSandbox(id);
    if (!sb.ok()) return sb.status();
    out.sandbox = std::move(sb).value();
    auto t = GetTenant(out.sandbox.tenant_id);
    if (t.ok()) {
      out.tenant = std::move(t).value();
    } else if (!absl::IsNotFound(t.status())) {
      return t.status();
    }
    return out;
  }
  virtual absl::StatusOr<Page<SandboxRecord>> ListSandboxes(const SandboxFilter& filter) = 0;
  // Every sandbox of `node` not in state "deleted" (all tenants): the start-up reconciler's
  // input.
  virtual absl::StatusOr<std::vector<SandboxRecord>> ListLiveSandboxes(const std::string& node) = 0;
  // A sandbox in state "lost" stays lost (its node was declared gone, docs/scale.md) unless the
  // new row is lost, deleting or deleted: a node that comes back cannot revive it. Such a put
  // changes nothing and is not an error.
  virtual absl::Status PutSandbox(const SandboxRecord& rec) = 0;
  // Sandboxes per state (all tenants), the deleted ones left out: their rows are kept for good,
  // and a count of them would cost a scan that grows with history. States without a sandbox
  // are absent. Cost grows with the live sandboxes only (the sandboxes_live index).
  virtual absl::StatusOr<std::map<std::string, int64_t>> CountLiveSandboxesByState() = 0;

  virtual absl::StatusOr<OperationRecord> GetOperation(const std::string& id) = 0;
  // A finished operation (succeeded or failed) is never changed again: a put over one changes
  // nothing and is not an error (an operation failed because its node was lost stays failed).
  virtual absl::Status PutOperation(const OperationRecord& rec) = 0;
  // Every operation of one sandbox, oldest first.
  virtual absl::StatusOr<std::vector<OperationRecord>> ListOperations(
      const std::string& sandbox_id) = 0;
  // Operations of `node` in state pending or running (all tenants): re-driven after a restart.
  virtual absl::StatusOr<std::vector<OperationRecord>> ListUnfinishedOperations(
      const std::string& node) = 0;
  // Gives the sandboxes and operations of no node (rows from before schema 9) to `node`;
  // returns how many sandboxes. Only a single-host (`--role all`) sbxd calls it.
  virtual absl::StatusOr<int64_t> ClaimUnassigned(const std::string& node) = 0;

  // Nodes (docs/scale.md). GetNode: NotFound when absent. ListNodes: by name.
  virtual absl::StatusOr<NodeRecord> GetNode(const std::string& name) = 0;
  virtual absl::Status PutNode(const NodeRecord& rec) = 0;
  virtual absl::StatusOr<std::vector<NodeRecord>> ListNodes() = 0;
  // Sandboxes that hold resources (not deleted, failed or lost) per node; nodes without one
  // are absent.
  virtual absl::StatusOr<std::map<std::string, int64_t>> CountHeldSandboxesByNode() = 0;
  // The same count restricted to `tenant_id`'s sandboxes whose label `key` is `value`
  // (placement's anti-affinity).
  virtual absl::StatusOr<std::map<std::string, int64_t>> CountLabelledSandboxesByNode(
      const std::string& tenant_id, const std::string& key, const std::string& value) = 0;

  virtual absl::StatusOr<SessionRecord> GetSession(const std::string& id) = 0;
  virtual absl::Status PutSession(const SessionRecord& rec) = 0;
  // Ends session `id` as `end` says unless it has ended already (started_at becomes end.at
  // if it was never set). Returns the state it ended from, or "" when it had ended before
  // (nothing changes then); NotFound without such a session. PostgreSQL does it in one
  // statement (Store::EndSession: one round trip in all), SQLite in two that leave the spec
  // alone; this default reads the whole row, then writes it.
  virtual absl::StatusOr<std::string> EndSession(const std::string& id, const SessionEnd& end) {
    auto got = GetSession(id);
    if (!got.ok()) return got.status();
    SessionRecord s = std::move(got).value();
    if (s.state == "exited") return std::string();
    std::string was = s.state;
    if (!s.started_at) s.started_at = end.at;
    s.state = "exited";
    s.exit_code = end.exit_code;
    s.signal = end.signal;
    s.timed_out = end.timed_out;
    s.oom_killed = end.oom_killed;
    s.exited_at = end.at;
    if (absl::Status st = PutSession(s); !st.ok()) return st;
    return was;
  }
  virtual absl::StatusOr<std::vector<SessionRecord>> ListSessions(const std::string& sandbox_id) = 0;

  virtual absl::StatusOr<std::optional<IdempotencyRecord>> GetIdempotency(
      const std::string& tenant_id, const std::string& key, const std::string& method,
      const std::string& route) = 0;
  virtual absl::Status PutIdempotency(const IdempotencyRecord& rec) = 0;
  virtual absl::StatusOr<ImageRecord> GetImage(const std::string& digest) = 0;
  virtual absl::Status PutImage(const ImageRecord& rec) = 0;
  virtual absl::Status DeleteImage(const std::string& digest) = 0;
  virtual absl::StatusOr<std::vector<ImageRecord>> ListImages() = 0;  // by created_at
  virtual absl::StatusOr<TagRecord> GetTag(const std::string& name, const std::string& tag) = 0;
  virtual absl::Status PutTag(const TagRecord& rec) = 0;
  virtual absl::Status DeleteTag(const std::string& name, const std::string& tag) = 0;
  virtual absl::StatusOr<std::vector<TagRecord>> ListTags() = 0;  // by name, tag
  // Sandboxes not deleted whose template_digest is `digest` (the sandboxes_by_digest index).
  virtual absl::StatusOr<int64_t> CountLiveSandboxesWithDigest(const std::string& digest) = 0;

  // Tenants (issue 18). DeleteTenant also deletes the tenant's tokens (its sandboxes, templates
  // and audit lines are the caller's business); NotFound when absent.
  virtual absl::StatusOr<TenantRecord> GetTenant(const std::string& id) = 0;
  virtual absl::Status PutTenant(const TenantRecord& rec) = 0;
  virtual absl::StatusOr<std::vector<TenantRecord>> ListTenants() = 0;  // by created_at, id
  virtual absl::Status DeleteTenant(const std::string& id) = 0;
  // A token's tenant must exist when the transaction commits (a deferred foreign key).
  virtual absl::StatusOr<TokenRecord> GetToken(const std::string& id) = 0;
  virtual absl::Status PutToken(const TokenRecord& rec) = 0;
  virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens(
      const std::string& tenant_id) = 0;  // by created_at, id
  // Appends one line (rec.seq is ignored) and returns the seq it got.
  virtual absl::StatusOr<int64_t> AppendAudit(const AuditRecord& rec) = 0;
  // The same without the seq, which lets PostgreSQL send the line with the COMMIT (one round
  // trip for a transaction that only appends).
  virtual absl::Status AddAudit(const AuditRecord& rec) { return AppendAudit(rec).status(); }
  // By seq ascending.
  virtual absl::StatusOr<std::vector<AuditRecord>> ListAudit(const AuditFilter& filter) = 0;
  // One query over the tenant's live sandboxes (the sandboxes_tenant_usage index).
  virtual absl::StatusOr<TenantUsage> GetTenantUsage(const std::string& tenant_id) = 0;
  // Sessions of the sandbox not in state "exited".
  virtual absl::StatusOr<int64_t> CountLiveSessions(const std::string& sandbox_id) = 0;

  // Removes keys created before `before` (RFC 3339); returns how many.
  virtual absl::StatusOr<int64_t> PurgeIdempotency(const std::string& before) = 0;
  // Removes sandboxes deleted (state "deleted", updated_at) before `before`, with their
  // operations and sessions; returns how many sandboxes.
  virtual absl::StatusOr<int64_t> PurgeDeletedSandboxes(const std::string& before) = 0;
};

class Store {
 public:
  virtual ~Store() = default;
  // Runs `fn` in one transaction: commits if it returns OK, rolls back otherwise and returns
  // its status. SQLITE_BUSY and similar are retried inside; never returned as success.
  //
  // `fn` may run more than once: PostgreSQL rolls back a transaction that lost a serialization
  // race and the store runs `fn` again. Whatever `fn` changes outside `tx` must be reset or
  // overwritten at its start, and side effects (metrics, logs, kernel or runtime calls,
  // callbacks) belong after Transact returns OK.
  virtual absl::Status Transact(const std::function<absl::Status(Tx&)>& fn) = 0;

  // Runs `fn`, which only reads, each statement seeing what was committed when it ran (no
  // snapshot spans two statements): for a view of one row or one page. PostgreSQL runs it
  // outside a transaction, one round trip per statement instead of three; a write in it fails
  // with FailedPrecondition. SQLite runs it as Transact.
  virtual absl::Status Read(const std::function<absl::Status(Tx&)>& fn) { return Transact(fn); }

  // Tx::EndSession as a transaction of its own: what an exit costs a session. PostgreSQL runs
  // it as a single statement with no BEGIN or COMMIT around it (atomic by itself, its row
  // locked while it runs): one round trip where a transaction's read, then write and commit,
  // took two.
  virtual absl::StatusOr<std::string> EndSession(const std::string& id, const SessionEnd& end) {
    std::string was;
    absl::Status st = Transact([&](Tx& tx) -> absl::Status {
      auto r = tx.EndSession(id, end);
      if (!r.ok()) return r.status();
      was = std::move(r).value();
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    return was;
  }
};

using StorePtr = std::unique_ptr<Store>;

}  // namespace sbx::store
