#include "store/sqlite_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "common/status_util.h"
#include "store/sqlite_handle.h"
#include "store/sqlite_rows.h"
#include "store/sqlite_schema.h"

namespace sbx::store {
namespace {

constexpr int kMaxPageSize = 500;
constexpr int kMaxAuditPage = 1000;

// Statements are cached by the address of these constants, so each must be a named array.
constexpr char kBegin[] = "BEGIN IMMEDIATE";
constexpr char kCommit[] = "COMMIT";
constexpr char kRollback[] = "ROLLBACK";

constexpr char kGetSandbox[] = "SELECT " SBX_STORE_SANDBOX_COLS " FROM sandboxes WHERE id = ?1";
// ?2 state filter, ?3 include_deleted, ?4/?5 label key/value, ?6 limit; the "after" variant
// starts strictly after the position (?7, ?8). Two statements rather than "?7 IS NULL OR ..."
// so later pages seek in sandboxes_by_tenant instead of scanning from the tenant's first row.
// json_each avoids building a JSON path from a caller-supplied label key.
#define SBX_LIST_SANDBOXES_WHERE                                                    \
  " FROM sandboxes"                                                                 \
  " WHERE tenant_id = ?1"                                                           \
  " AND (?2 IS NULL OR state = ?2)"                                                 \
  " AND (?3 OR state <> 'deleted')"                                                 \
  " AND (?4 IS NULL OR EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l"      \
  "      WHERE l.key = ?4 AND l.type = 'text' AND l.value = ?5))"
constexpr char kListSandboxesFirst[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                       SBX_LIST_SANDBOXES_WHERE
                                       " ORDER BY created_at, id LIMIT ?6";
constexpr char kListSandboxesAfter[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                       SBX_LIST_SANDBOXES_WHERE
                                       " AND (created_at, id) > (?7, ?8)"
                                       " ORDER BY created_at, id LIMIT ?6";
#undef SBX_LIST_SANDBOXES_WHERE
constexpr char kListLiveSandboxes[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                      " FROM sandboxes WHERE state <> 'deleted'"
                                      " ORDER BY created_at, id";
// The partial index sandboxes_live has the same condition, so only live rows are visited.
constexpr char kCountLiveSandboxesByState[] =
    "SELECT state, COUNT(*) FROM sandboxes WHERE state <> 'deleted' GROUP BY state";
constexpr char kPutSandbox[] = "INSERT INTO sandboxes (" SBX_STORE_SANDBOX_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, state = excluded.state,
  template_ref = excluded.template_ref, template_digest = excluded.template_digest,
  runtime = excluded.runtime, resources = excluded.resources,
  effective_resources = excluded.effective_resources, egress_profile = excluded.egress_profile,
  env = excluded.env, labels = excluded.labels, timeout_s = excluded.timeout_s,
  created_at = excluded.created_at, updated_at = excluded.updated_at,
  current_operation_id = excluded.current_operation_id, error = excluded.error,
  runtime_state = excluded.runtime_state, idle_suspend_s = excluded.idle_suspend_s,
  egress = excluded.egress, port_access = excluded.port_access)sql";

constexpr char kGetOperation[] =
    "SELECT " SBX_STORE_OPERATION_COLS " FROM operations WHERE id = ?1";
constexpr char kListUnfinishedOperations[] =
    "SELECT " SBX_STORE_OPERATION_COLS
    " FROM operations WHERE state IN ('pending', 'running') ORDER BY created_at, id";
constexpr char kListOperations[] = "SELECT " SBX_STORE_OPERATION_COLS
                                   " FROM operations WHERE sandbox_id = ?1"
                                   " ORDER BY created_at, id";
constexpr char kPutOperation[] = "INSERT INTO operations (" SBX_STORE_OPERATION_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, kind = excluded.kind, sandbox_id = excluded.sandbox_id,
  state = excluded.state, error = excluded.error, result = excluded.result,
  created_at = excluded.created_at, updated_at = excluded.updated_at,
  completed_at = excluded.completed_at, initiator = excluded.initiator,
  target = excluded.target, progress = excluded.progress)sql";

constexpr char kGetImage[] = "SELECT " SBX_STORE_IMAGE_COLS " FROM images WHERE digest = ?1";
constexpr char kPutImage[] = "INSERT INTO images (" SBX_STORE_IMAGE_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (digest) DO UPDATE SET
  name = excluded.name, layers = excluded.layers, config = excluded.config,
  source = excluded.source, size = excluded.size, created_at = excluded.created_at)sql";
constexpr char kDeleteImage[] = "DELETE FROM images WHERE digest = ?1";
constexpr char kListImages[] =
    "SELECT " SBX_STORE_IMAGE_COLS " FROM images ORDER BY created_at, digest";
constexpr char kGetTag[] =
    "SELECT " SBX_STORE_TAG_COLS " FROM template_tags WHERE name = ?1 AND tag = ?2";
constexpr char kPutTag[] = "INSERT INTO template_tags (" SBX_STORE_TAG_COLS R"sql()
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (name, tag) DO UPDATE SET
  digest = excluded.digest, updated_at = excluded.updated_at)sql";
constexpr char kDeleteTag[] = "DELETE FROM template_tags WHERE name = ?1 AND tag = ?2";
constexpr char kListTags[] = "SELECT " SBX_STORE_TAG_COLS " FROM template_tags ORDER BY name, tag";
constexpr char kCountLiveWithDigest[] =
    "SELECT COUNT(*) FROM sandboxes WHERE template_digest = ?1 AND state <> 'deleted'";

constexpr char kGetSession[] = "SELECT " SBX_STORE_SESSION_COLS " FROM sessions WHERE id = ?1";
constexpr char kListSessions[] = "SELECT " SBX_STORE_SESSION_COLS
                                 " FROM sessions WHERE sandbox_id = ?1 ORDER BY created_at, id";
constexpr char kPutSession[] = "INSERT INTO sessions (" SBX_STORE_SESSION_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, sandbox_id = excluded.sandbox_id, state = excluded.state,
  spec = excluded.spec, exit_code = excluded.exit_code, signal = excluded.signal,
  timed_out = excluded.timed_out, oom_killed = excluded.oom_killed,
  created_at = excluded.created_at, started_at = excluded.started_at,
  exited_at = excluded.exited_at, error = excluded.error)sql";

constexpr char kGetIdempotency[] = "SELECT " SBX_STORE_IDEMPOTENCY_COLS
                                   " FROM idempotency_keys"
                                   " WHERE tenant_id = ?1 AND key = ?2 AND method = ?3"
                                   " AND route = ?4";
constexpr char kPutIdempotency[] =
    "INSERT INTO idempotency_keys (" SBX_STORE_IDEMPOTENCY_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (tenant_id, key, method, route) DO UPDATE SET
  body_hash = excluded.body_hash, status = excluded.status,
  response_body = excluded.response_body, created_at = excluded.created_at)sql";
constexpr char kPurgeIdempotency[] = "DELETE FROM idempotency_keys WHERE created_at < ?1";
// Children first: the foreign keys are checked at COMMIT, but a dangling row must never exist.
constexpr char kPurgeDeletedSessions[] =
    "DELETE FROM sessions WHERE sandbox_id IN"
    " (SELECT id FROM sandboxes WHERE state = 'deleted' AND updated_at < ?1)";
constexpr char kPurgeDeletedOperations[] =
    "DELETE FROM operations WHERE sandbox_id IN"
    " (SELECT id FROM sandboxes WHERE state = 'deleted' AND updated_at < ?1)";
constexpr char kPurgeDeletedSandboxes[] =
    "DELETE FROM sandboxes WHERE state = 'deleted' AND updated_at < ?1";
// Template operations (imports, pulls, builds) have no sandbox to go with: a finished one goes
// after the same retention as a deleted sandbox's, counted from its end.
constexpr char kPurgeTemplateOperations[] =
    "DELETE FROM operations WHERE sandbox_id = '' AND state IN ('succeeded', 'failed')"
    " AND completed_at IS NOT NULL AND completed_at < ?1";

constexpr char kGetTenant[] = "SELECT " SBX_STORE_TENANT_COLS " FROM tenants WHERE id = ?1";
constexpr char kPutTenant[] = "INSERT INTO tenants (" SBX_STORE_TENANT_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (id) DO UPDATE SET
  name = excluded.name, state = excluded.state, quotas = excluded.quotas,
  rate_limit = excluded.rate_limit, created_at = excluded.created_at,
  updated_at = excluded.updated_at, egress_profiles = excluded.egress_profiles)sql";
constexpr char kListTenants[] =
    "SELECT " SBX_STORE_TENANT_COLS " FROM tenants ORDER BY created_at, id";
constexpr char kDeleteTenant[] = "DELETE FROM tenants WHERE id = ?1";
constexpr char kDeleteTenantTokens[] = "DELETE FROM tokens WHERE tenant_id = ?1";
constexpr char kGetToken[] = "SELECT " SBX_STORE_TOKEN_COLS " FROM tokens WHERE id = ?1";
constexpr char kPutToken[] = "INSERT INTO tokens (" SBX_STORE_TOKEN_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, name = excluded.name, hash = excluded.hash,
  scopes = excluded.scopes, expires_at = excluded.expires_at, created_at = excluded.created_at,
  revoked_at = excluded.revoked_at)sql";
constexpr char kListTokens[] = "SELECT " SBX_STORE_TOKEN_COLS
                               " FROM tokens WHERE tenant_id = ?1 ORDER BY created_at, id";
// No upsert: a line is only ever appended (and the table's trigger refuses updates).
constexpr char kAppendAudit[] = "INSERT INTO audit_log (" SBX_STORE_AUDIT_COLS
                                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
// ?1 tenant (the "Tenant" variant only), ?2 since, ?3 after_seq, ?4 limit. Two statements so
// that one tenant's page seeks in audit_by_tenant; all tenants' walks the seq (rowid) order.
constexpr char kListAuditAll[] = "SELECT " SBX_STORE_AUDIT_COLS
                                 " FROM audit_log WHERE seq > ?3 AND time >= ?2"
                                 " ORDER BY seq LIMIT ?4";
constexpr char kListAuditTenant[] = "SELECT " SBX_STORE_AUDIT_COLS
                                    " FROM audit_log WHERE tenant_id = ?1 AND seq > ?3"
                                    " AND time >= ?2 ORDER BY seq LIMIT ?4";
// The WHERE repeats sandboxes_tenant_usage's condition word for word, so SQLite may use that
// partial index. A suspended sandbox holds its disk only; a missing key (or a null
// effective_resources) counts 0.
constexpr char kGetTenantUsage[] = R"sql(SELECT COUNT(*),
  IFNULL(SUM(CASE WHEN state = 'suspended' THEN 0
                  ELSE IFNULL(json_extract(effective_resources, '$.vcpu'), 0) END), 0),
  IFNULL(SUM(CASE WHEN state = 'suspended' THEN 0
                  ELSE IFNULL(json_extract(effective_resources, '$.memory_mib'), 0) END), 0),
  IFNULL(SUM(IFNULL(json_extract(effective_resources, '$.disk_mib'), 0)), 0)
FROM sandboxes WHERE tenant_id = ?1 AND state NOT IN ('deleted', 'failed'))sql";
constexpr char kCountLiveSessions[] =
    "SELECT COUNT(*) FROM sessions WHERE sandbox_id = ?1 AND state <> 'exited'";

// What sbx_store_query_duration_seconds{op} distinguishes: the Tx methods, BEGIN and COMMIT.
enum class QueryOp {
  kBegin,
  kCommit,
  kGetSandbox,
  kListSandboxes,
  kListLiveSandboxes,
  kCountLiveSandboxesByState,
  kPutSandbox,
  kGetOperation,
  kPutOperation,
  kListOperations,
  kListUnfinishedOperations,
  kGetSession,
  kPutSession,
  kListSessions,
  kGetIdempotency,
  kPutIdempotency,
  kPurgeIdempotency,
  kPurgeDeletedSandboxes,
  kTemplates,
  kTenants,
  kGetToken,
  kAppendAudit,
  kListAudit,
  kGetTenantUsage,
  kCountLiveSessions,
  kCount,
};
constexpr std::string_view kQueryOpNames[] = {
    "Begin", "Commit", "GetSandbox", "ListSandboxes", "ListLiveSandboxes",
    "CountLiveSandboxesByState", "PutSandbox", "GetOperation", "PutOperation", "ListOperations",
    "ListUnfinishedOperations", "GetSession", "PutSession", "ListSessions", "GetIdempotency",
    "PutIdempotency", "PurgeIdempotency", "PurgeDeletedSandboxes", "Templates", "Tenants",
    "GetToken", "AppendAudit", "ListAudit", "GetTenantUsage", "CountLiveSessions",
};
static_assert(std::size(kQueryOpNames) == static_cast<size_t>(QueryOp::kCount));

class SqliteStore final : public Store {
 public:
  SqliteStore(SqliteDb db, std::string path, metrics::Registry& registry)
      : db_(std::move(db)), path_(std::move(path)) {
    // Most statements take tens of microseconds; the top buckets catch busy waits and fsyncs.
    auto& family = registry.AddHistogram(
        "sbx_store_query_duration_seconds",
        "Time of one store statement (op: the store method, or Begin/Commit of a transaction).",
        {"op"},
        {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
         1, 5});
    for (size_t i = 0; i < timers_.size(); ++i) timers_[i] = &family.WithLabels({kQueryOpNames[i]});
  }

  metrics::Histogram& Timer(QueryOp op) { return *timers_[static_cast<size_t>(op)]; }

  absl::Status Init() { return PrepareSchema(db_.get(), path_); }
  absl::Status Transact(const std::function<absl::Status(Tx&)>& fn) override;

  // The methods below require mu_ to be held (they are only reached from inside Transact).
  sqlite3* db() const { return db_.get(); }
  absl::StatusOr<sqlite3_stmt*> Prepare(const char* sql, std::string_view step);
  // Runs a statement that returns no rows.
  absl::Status Exec(const char* sql, std::string_view step);

 private:
  absl::Status Begin();
  absl::Status Commit();
  // Rolls back if a transaction is open; returns the ROLLBACK failure, if any.
  absl::Status RollbackIfOpen();

  std::mutex mu_;
  // Detects Transact called from inside fn, which would otherwise self-deadlock on mu_.
  std::atomic<std::thread::id> owner_{};
  SqliteDb db_;
  // Declared after db_ so the statements are finalized before the connection closes.
  std::unordered_map<const char*, SqliteStmt> stmts_;
  std::string path_;
  std::array<metrics::Histogram*, static_cast<size_t>(QueryOp::kCount)> timers_{};
};

absl::StatusOr<sqlite3_stmt*> SqliteStore::Prepare(const char* sql, std::string_view step) {
  auto it = stmts_.find(sql);
  if (it != stmts_.end()) return it->second.get();
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  SqliteStmt stmt(raw);
  if (rc != SQLITE_OK) return SqliteError(db_.get(), rc, fmt::format("{}: prepare", step));
  return stmts_.emplace(sql, std::move(stmt)).first->second.get();
}

absl::Status SqliteStore::Exec(const char* sql, std::string_view step) {
  SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, Prepare(sql, step));
  StmtCursor q(stmt);
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
  }
  if (rc != SQLITE_DONE) return SqliteError(db_.get(), rc, step);
  return absl::OkStatus();
}

absl::Status SqliteStore::Begin() {
  metrics::ScopedTimer timer(Timer(QueryOp::kBegin));
  for (int attempt = 0;; ++attempt) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, Prepare(kBegin, "begin"));
    StmtCursor q(stmt);
    int rc = q.Step();
    if (rc == SQLITE_DONE) return absl::OkStatus();
    if (!IsBusy(rc) || attempt >= kBusyRetries) return SqliteError(db_.get(), rc, "begin");
    BackoffSleep(attempt);
  }
}

absl::Status SqliteStore::Commit() {
  metrics::ScopedTimer timer(Timer(QueryOp::kCommit));
  for (int attempt = 0;; ++attempt) {
    int rc;
    {
      SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, Prepare(kCommit, "commit"));
      StmtCursor q(stmt);
      rc = q.Step();
    }
    if (rc == SQLITE_DONE) return absl::OkStatus();
    // A COMMIT that fails on BUSY or a deferred foreign key leaves the transaction open.
    if (IsBusy(rc) && attempt < kBusyRetries && !sqlite3_get_autocommit(db_.get())) {
      BackoffSleep(attempt);
      continue;
    }
    absl::Status st = SqliteError(db_.get(), rc, "commit");
    (void)RollbackIfOpen();
    return st;
  }
}

absl::Status SqliteStore::RollbackIfOpen() {
  if (sqlite3_get_autocommit(db_.get())) return absl::OkStatus();
  return Exec(kRollback, "rollback");
}

class SqliteTx final : public Tx {
 public:
  explicit SqliteTx(SqliteStore& store) : store_(store) {}

  absl::StatusOr<SandboxRecord> GetSandbox(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSandbox));
    return GetById<SandboxRecord>(kGetSandbox, "get sandbox", "sandbox", id, ReadSandbox);
  }

  absl::StatusOr<Page<SandboxRecord>> ListSandboxes(const SandboxFilter& filter) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListSandboxes));
    constexpr std::string_view kStep = "list sandboxes";
    std::optional<std::pair<std::string, std::string>> after;
    if (!filter.page_token.empty()) {
      after = DecodePageToken(filter.page_token);
      if (!after) return absl::InvalidArgumentError("page_token is invalid");
    }
    const int limit = std::clamp(filter.limit, 1, kMaxPageSize);

    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt,
                         store_.Prepare(after ? kListSandboxesAfter : kListSandboxesFirst, kStep));
    StmtCursor q(stmt);
    q.Bind(1, filter.tenant_id);
    q.Bind(2, filter.state);
    q.Bind(3, filter.include_deleted);
    if (filter.label) {
      q.Bind(4, filter.label->first).Bind(5, filter.label->second);
    }
    // One extra row tells whether another page exists without a COUNT query.
    q.Bind(6, int64_t{limit} + 1);
    if (after) {
      q.Bind(7, after->first).Bind(8, after->second);
    }

    Page<SandboxRecord> page;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      if (static_cast<int>(page.items.size()) == limit) {
        page.next_page_token = EncodePageToken(page.items.back());
        break;
      }
      SBX_ASSIGN_OR_RETURN(SandboxRecord r, ReadSandbox(q));
      page.items.push_back(std::move(r));
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error(rc, kStep);
    return page;
  }

  absl::StatusOr<std::vector<SandboxRecord>> ListLiveSandboxes() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListLiveSandboxes));
    return ListAll<SandboxRecord>(kListLiveSandboxes, "list live sandboxes", ReadSandbox);
  }

  absl::StatusOr<std::map<std::string, int64_t>> CountLiveSandboxesByState() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kCountLiveSandboxesByState));
    constexpr std::string_view kStep = "count live sandboxes by state";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kCountLiveSandboxesByState, kStep));
    StmtCursor q(stmt);
    std::map<std::string, int64_t> out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      const auto* state = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      out[state != nullptr ? state : ""] = sqlite3_column_int64(stmt, 1);
    }
    if (rc != SQLITE_DONE) return Error(rc, kStep);
    return out;
  }

  absl::Status PutSandbox(const SandboxRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSandbox));
    return Put(kPutSandbox, "put sandbox", r, BindSandbox);
  }

  absl::StatusOr<OperationRecord> GetOperation(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetOperation));
    return GetById<OperationRecord>(kGetOperation, "get operation", "operation", id,
                                    ReadOperation);
  }

  absl::Status PutOperation(const OperationRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutOperation));
    return Put(kPutOperation, "put operation", r, BindOperation);
  }

  absl::StatusOr<std::vector<OperationRecord>> ListUnfinishedOperations() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListUnfinishedOperations));
    return ListAll<OperationRecord>(kListUnfinishedOperations, "list unfinished operations",
                                    ReadOperation);
  }

  absl::StatusOr<std::vector<OperationRecord>> ListOperations(
      const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListOperations));
    return ListAll<OperationRecord>(kListOperations, "list operations", ReadOperation,
                                    &sandbox_id);
  }

  // Templates are rare writes and small reads: one timer for all their statements.
  absl::StatusOr<ImageRecord> GetImage(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return GetById<ImageRecord>(kGetImage, "get image", "template image", digest, ReadImage);
  }

  absl::Status PutImage(const ImageRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Put(kPutImage, "put image", r, BindImage);
  }

  absl::Status DeleteImage(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return DeleteByKey(kDeleteImage, "delete image", digest, nullptr);
  }

  absl::StatusOr<std::vector<ImageRecord>> ListImages() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return ListAll<ImageRecord>(kListImages, "list images", ReadImage);
  }

  absl::StatusOr<TagRecord> GetTag(const std::string& name, const std::string& tag) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    constexpr std::string_view kStep = "get template tag";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kGetTag, kStep));
    StmtCursor q(stmt);
    q.Bind(1, name).Bind(2, tag);
    int rc = q.Step();
    if (rc == SQLITE_DONE) {
      return absl::NotFoundError(fmt::format("template {}:{} not found", name, tag));
    }
    if (rc != SQLITE_ROW) return Error(rc, kStep);
    return ReadTag(q);
  }

  absl::Status PutTag(const TagRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Put(kPutTag, "put template tag", r, BindTag);
  }

  absl::Status DeleteTag(const std::string& name, const std::string& tag) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return DeleteByKey(kDeleteTag, "delete template tag", name, &tag);
  }

  absl::StatusOr<std::vector<TagRecord>> ListTags() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return ListAll<TagRecord>(kListTags, "list template tags", ReadTag);
  }

  absl::StatusOr<int64_t> CountLiveSandboxesWithDigest(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return CountOne(kCountLiveWithDigest, "count sandboxes of a template digest", digest);
  }

  absl::StatusOr<SessionRecord> GetSession(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSession));
    return GetById<SessionRecord>(kGetSession, "get session", "session", id, ReadSession);
  }

  absl::Status PutSession(const SessionRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSession));
    return Put(kPutSession, "put session", r, BindSession);
  }

  absl::StatusOr<std::vector<SessionRecord>> ListSessions(const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListSessions));
    return ListAll<SessionRecord>(kListSessions, "list sessions", ReadSession, &sandbox_id);
  }

  absl::StatusOr<std::optional<IdempotencyRecord>> GetIdempotency(
      const std::string& tenant_id, const std::string& key, const std::string& method,
      const std::string& route) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetIdempotency));
    constexpr std::string_view kStep = "get idempotency key";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kGetIdempotency, kStep));
    StmtCursor q(stmt);
    q.Bind(1, tenant_id).Bind(2, key).Bind(3, method).Bind(4, route);
    int rc = q.Step();
    if (rc == SQLITE_DONE) return std::optional<IdempotencyRecord>();
    if (rc != SQLITE_ROW) return Error(rc, kStep);
    return std::optional<IdempotencyRecord>(ReadIdempotency(q));
  }

  absl::Status PutIdempotency(const IdempotencyRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutIdempotency));
    return Put(kPutIdempotency, "put idempotency key", r, BindIdempotency);
  }

  absl::StatusOr<int64_t> PurgeIdempotency(const std::string& before) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPurgeIdempotency));
    return DeleteWhere(kPurgeIdempotency, "purge idempotency keys", before);
  }

  absl::StatusOr<int64_t> PurgeDeletedSandboxes(const std::string& before) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPurgeDeletedSandboxes));
    constexpr std::string_view kStep = "purge deleted sandboxes";
    for (const char* sql : {kPurgeDeletedSessions, kPurgeDeletedOperations,
                            kPurgeTemplateOperations}) {
      SBX_RETURN_IF_ERROR(DeleteWhere(sql, kStep, before).status());
    }
    return DeleteWhere(kPurgeDeletedSandboxes, kStep, before);
  }

  // Tenant and token management is rare: one timer for its statements. GetToken (every
  // authenticated request) and the audit and quota reads have their own.
  absl::StatusOr<TenantRecord> GetTenant(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return GetById<TenantRecord>(kGetTenant, "get tenant", "tenant", id, ReadTenant);
  }

  absl::Status PutTenant(const TenantRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return Put(kPutTenant, "put tenant", r, BindTenant);
  }

  absl::StatusOr<std::vector<TenantRecord>> ListTenants() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return ListAll<TenantRecord>(kListTenants, "list tenants", ReadTenant);
  }

  absl::Status DeleteTenant(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    constexpr std::string_view kStep = "delete tenant";
    SBX_ASSIGN_OR_RETURN(int64_t n, DeleteWhere(kDeleteTenant, kStep, id));
    if (n == 0) return absl::NotFoundError(fmt::format("tenant {} not found", id));
    // The tokens' foreign key is deferred, so they may go after their tenant.
    return DeleteWhere(kDeleteTenantTokens, kStep, id).status();
  }

  absl::StatusOr<TokenRecord> GetToken(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetToken));
    return GetById<TokenRecord>(kGetToken, "get token", "token", id, ReadToken);
  }

  absl::Status PutToken(const TokenRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return Put(kPutToken, "put token", r, BindToken);
  }

  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const std::string& tenant_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return ListAll<TokenRecord>(kListTokens, "list tokens", ReadToken, &tenant_id);
  }

  absl::StatusOr<int64_t> AppendAudit(const AuditRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kAppendAudit));
    SBX_RETURN_IF_ERROR(Put(kAppendAudit, "append audit line", r, BindAudit));
    return static_cast<int64_t>(sqlite3_last_insert_rowid(store_.db()));
  }

  absl::StatusOr<std::vector<AuditRecord>> ListAudit(const AuditFilter& filter) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListAudit));
    constexpr std::string_view kStep = "list audit lines";
    const char* sql = filter.tenant_id ? kListAuditTenant : kListAuditAll;
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, kStep));
    StmtCursor q(stmt);
    if (filter.tenant_id) q.Bind(1, *filter.tenant_id);
    q.Bind(2, filter.since).Bind(3, filter.after_seq);
    q.Bind(4, int64_t{std::clamp(filter.limit, 1, kMaxAuditPage)});
    std::vector<AuditRecord> out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      SBX_ASSIGN_OR_RETURN(AuditRecord r, ReadAudit(q));
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error(rc, kStep);
    return out;
  }

  absl::StatusOr<TenantUsage> GetTenantUsage(const std::string& tenant_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetTenantUsage));
    constexpr std::string_view kStep = "get tenant usage";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kGetTenantUsage, kStep));
    StmtCursor q(stmt);
    q.Bind(1, tenant_id);
    int rc = q.Step();
    if (rc != SQLITE_ROW) return Error(rc, kStep);
    return TenantUsage{q.Int(0), q.Int(1), q.Int(2), q.Int(3)};
  }

  absl::StatusOr<int64_t> CountLiveSessions(const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kCountLiveSessions));
    return CountOne(kCountLiveSessions, "count live sessions", sandbox_id);
  }

 private:
  absl::Status Error(int rc, std::string_view step) const {
    return SqliteError(store_.db(), rc, step);
  }

  absl::Status Done(StmtCursor& q, std::string_view step) const {
    int rc = q.Step();
    return rc == SQLITE_DONE ? absl::OkStatus() : Error(rc, step);
  }

  // One row by its id; NotFound "<what> <id> not found" when there is none.
  template <typename T, typename ReadFn>
  absl::StatusOr<T> GetById(const char* sql, std::string_view step, std::string_view what,
                            const std::string& id, ReadFn read) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, step));
    StmtCursor q(stmt);
    q.Bind(1, id);
    int rc = q.Step();
    if (rc == SQLITE_DONE) return absl::NotFoundError(fmt::format("{} {} not found", what, id));
    if (rc != SQLITE_ROW) return Error(rc, step);
    return read(q);
  }

  template <typename T, typename BindFn>
  absl::Status Put(const char* sql, std::string_view step, const T& rec, BindFn bind) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, step));
    StmtCursor q(stmt);
    SBX_RETURN_IF_ERROR(bind(q, rec));
    return Done(q, step);
  }

  // Runs a DELETE of one row by its key (?1, and ?2 when given); a missing row is not an error.
  absl::Status DeleteByKey(const char* sql, std::string_view step, const std::string& k1,
                           const std::string* k2) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, step));
    StmtCursor q(stmt);
    q.Bind(1, k1);
    if (k2 != nullptr) q.Bind(2, *k2);
    return Done(q, step);
  }

  // Runs a DELETE whose ?1 is `param` (a time bound, a key); returns how many rows it removed.
  absl::StatusOr<int64_t> DeleteWhere(const char* sql, std::string_view step,
                                      const std::string& param) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, step));
    StmtCursor q(stmt);
    q.Bind(1, param);
    SBX_RETURN_IF_ERROR(Done(q, step));
    return static_cast<int64_t>(sqlite3_changes64(store_.db()));
  }

  // Runs a "SELECT COUNT(*) ... ?1" and returns the count.
  absl::StatusOr<int64_t> CountOne(const char* sql, std::string_view step,
                                   const std::string& param) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, step));
    StmtCursor q(stmt);
    q.Bind(1, param);
    int rc = q.Step();
    if (rc != SQLITE_ROW) return Error(rc, step);
    return q.Int(0);
  }

  template <typename T, typename ReadFn>
  absl::StatusOr<std::vector<T>> ListAll(const char* sql, std::string_view step, ReadFn read,
                                         const std::string* param = nullptr) {
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, step));
    StmtCursor q(stmt);
    if (param != nullptr) q.Bind(1, *param);
    std::vector<T> out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      SBX_ASSIGN_OR_RETURN(T r, read(q));
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error(rc, step);
    return out;
  }

  SqliteStore& store_;
};

absl::Status SqliteStore::Transact(const std::function<absl::Status(Tx&)>& fn) {
  if (owner_.load() == std::this_thread::get_id()) {
    return absl::FailedPreconditionError("store: Transact called from inside a transaction");
  }
  std::lock_guard<std::mutex> lock(mu_);
  owner_.store(std::this_thread::get_id());
  // Runs on every exit, including an exception escaping fn: the connection must never be left
  // inside a transaction, or every later Transact would fail on BEGIN.
  struct Exit {
    SqliteStore* s;
    ~Exit() {
      (void)s->RollbackIfOpen();
      s->owner_.store(std::thread::id());
    }
  } exit{this};

  SBX_RETURN_IF_ERROR(Begin());
  SqliteTx tx(*this);
  absl::Status st = fn(tx);
  if (!st.ok()) {
    absl::Status rb = RollbackIfOpen();
    if (!rb.ok()) {
      return absl::Status(st.code(), fmt::format("{} (and {})", std::string(st.message()),
                                                 std::string(rb.message())));
    }
    return st;
  }
  // SQLite rolls the transaction back by itself after some errors (SQLITE_FULL, IOERR, NOMEM).
  // If fn swallowed such an error and returned OK, a COMMIT would fail confusingly or, worse,
  // succeed as an autocommit no-op; report the lost transaction instead.
  if (sqlite3_get_autocommit(db_.get())) {
    return absl::AbortedError(
        "store: commit: SQLite rolled the transaction back after an earlier error");
  }
  return Commit();
}

}  // namespace

absl::StatusOr<StorePtr> OpenSqliteStore(const std::string& path, metrics::Registry& registry) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX |
                               SQLITE_OPEN_EXRESCODE,
                           nullptr);
  SqliteDb db(raw);  // sqlite3_open_v2 allocates a handle even when it fails
  if (rc != SQLITE_OK) return SqliteError(raw, rc, fmt::format("open {}", path));
  auto store = std::make_unique<SqliteStore>(std::move(db), path, registry);
  SBX_RETURN_IF_ERROR(store->Init());
  return StorePtr(std::move(store));
}

}  // namespace sbx::store
