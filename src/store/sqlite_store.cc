#include "store/sqlite_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <iterator>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "store/sqlite_handle.h"

namespace sbx::store {
namespace {

// Each busy wait already blocks up to kBusyTimeoutMs inside SQLite; the retries on top only
// cover the cases where SQLite returns SQLITE_BUSY without consulting the busy handler.
constexpr int kBusyTimeoutMs = 5000;
constexpr int kBusyRetries = 2;
constexpr int kMaxPageSize = 500;

// Schema migrations. Entry i upgrades PRAGMA user_version i to i + 1. Append only: never edit
// an entry that has shipped, add a new one instead.
//
// JSON columns hold json::dump() text, or NULL for a JSON null. Foreign keys are DEFERRED so a
// transaction may write an operation or session before the sandbox it points at; the check
// runs at COMMIT.
constexpr const char* kMigrations[] = {
    R"sql(
CREATE TABLE sandboxes (
  id                   TEXT PRIMARY KEY,
  tenant_id            TEXT NOT NULL,
  state                TEXT NOT NULL,
  template_ref         TEXT NOT NULL,
  template_digest      TEXT NOT NULL,
  runtime              TEXT NOT NULL,
  resources            TEXT,
  effective_resources  TEXT,
  egress_profile       TEXT NOT NULL,
  env                  TEXT,
  labels               TEXT,
  timeout_s            INTEGER,
  created_at           TEXT NOT NULL,
  updated_at           TEXT NOT NULL,
  current_operation_id TEXT,
  error                TEXT,
  runtime_state        TEXT
) STRICT;
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant_id, created_at, id);
CREATE INDEX sandboxes_live ON sandboxes (created_at, id) WHERE state <> 'deleted';

CREATE TABLE operations (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL,
  kind         TEXT NOT NULL,
  sandbox_id   TEXT NOT NULL REFERENCES sandboxes (id) DEFERRABLE INITIALLY DEFERRED,
  state        TEXT NOT NULL,
  error        TEXT,
  result       TEXT,
  created_at   TEXT NOT NULL,
  updated_at   TEXT NOT NULL,
  completed_at TEXT
) STRICT;
CREATE INDEX operations_by_state ON operations (state, created_at, id);
CREATE INDEX operations_by_sandbox ON operations (sandbox_id);

CREATE TABLE sessions (
  id         TEXT PRIMARY KEY,
  tenant_id  TEXT NOT NULL,
  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) DEFERRABLE INITIALLY DEFERRED,
  state      TEXT NOT NULL,
  spec       TEXT,
  exit_code  INTEGER,
  signal     TEXT,
  timed_out  INTEGER NOT NULL,
  oom_killed INTEGER NOT NULL,
  created_at TEXT NOT NULL,
  started_at TEXT,
  exited_at  TEXT
) STRICT;
CREATE INDEX sessions_by_sandbox ON sessions (sandbox_id, created_at, id);

CREATE TABLE idempotency_keys (
  tenant_id     TEXT NOT NULL,
  key           TEXT NOT NULL,
  method        TEXT NOT NULL,
  route         TEXT NOT NULL,
  body_hash     TEXT NOT NULL,
  status        INTEGER NOT NULL,
  response_body TEXT NOT NULL,
  created_at    TEXT NOT NULL,
  PRIMARY KEY (tenant_id, key, method, route)
) STRICT;
CREATE INDEX idempotency_by_created ON idempotency_keys (created_at);
)sql",
    // 2: idle suspension per sandbox (null: the deployment default), and who started an
    // operation ("api", or the server's own timers: "ttl", "idle").
    R"sql(
ALTER TABLE sandboxes ADD COLUMN idle_suspend_s INTEGER;
ALTER TABLE operations ADD COLUMN initiator TEXT NOT NULL DEFAULT 'api';
CREATE INDEX sandboxes_deleted ON sandboxes (updated_at) WHERE state = 'deleted';
)sql",
    // 3: why a session ended without an exit of its own (its sandbox's agent died).
    R"sql(
ALTER TABLE sessions ADD COLUMN error TEXT;
)sql",
};
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

// Statements are cached by the address of these constants, so each must be a named array.
constexpr char kBegin[] = "BEGIN IMMEDIATE";
constexpr char kCommit[] = "COMMIT";
constexpr char kRollback[] = "ROLLBACK";

#define SBX_SANDBOX_COLS                                                                     \
  "id, tenant_id, state, template_ref, template_digest, runtime, resources, "                \
  "effective_resources, egress_profile, env, labels, timeout_s, created_at, updated_at, "    \
  "current_operation_id, error, runtime_state, idle_suspend_s"
#define SBX_OPERATION_COLS                                                                 \
  "id, tenant_id, kind, sandbox_id, state, error, result, created_at, updated_at, "          \
  "completed_at, initiator"
#define SBX_SESSION_COLS                                                                     \
  "id, tenant_id, sandbox_id, state, spec, exit_code, signal, timed_out, oom_killed, "        \
  "created_at, started_at, exited_at, error"
#define SBX_IDEMPOTENCY_COLS \
  "tenant_id, key, method, route, body_hash, status, response_body, created_at"

constexpr char kGetSandbox[] = "SELECT " SBX_SANDBOX_COLS " FROM sandboxes WHERE id = ?1";
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
constexpr char kListSandboxesFirst[] = "SELECT " SBX_SANDBOX_COLS SBX_LIST_SANDBOXES_WHERE
                                       " ORDER BY created_at, id LIMIT ?6";
constexpr char kListSandboxesAfter[] = "SELECT " SBX_SANDBOX_COLS SBX_LIST_SANDBOXES_WHERE
                                       " AND (created_at, id) > (?7, ?8)"
                                       " ORDER BY created_at, id LIMIT ?6";
#undef SBX_LIST_SANDBOXES_WHERE
constexpr char kListLiveSandboxes[] = "SELECT " SBX_SANDBOX_COLS
                                      " FROM sandboxes WHERE state <> 'deleted'"
                                      " ORDER BY created_at, id";
// The partial index sandboxes_live has the same condition, so only live rows are visited.
constexpr char kCountLiveSandboxesByState[] =
    "SELECT state, COUNT(*) FROM sandboxes WHERE state <> 'deleted' GROUP BY state";
constexpr char kPutSandbox[] = "INSERT INTO sandboxes (" SBX_SANDBOX_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, state = excluded.state,
  template_ref = excluded.template_ref, template_digest = excluded.template_digest,
  runtime = excluded.runtime, resources = excluded.resources,
  effective_resources = excluded.effective_resources, egress_profile = excluded.egress_profile,
  env = excluded.env, labels = excluded.labels, timeout_s = excluded.timeout_s,
  created_at = excluded.created_at, updated_at = excluded.updated_at,
  current_operation_id = excluded.current_operation_id, error = excluded.error,
  runtime_state = excluded.runtime_state, idle_suspend_s = excluded.idle_suspend_s)sql";

constexpr char kGetOperation[] = "SELECT " SBX_OPERATION_COLS " FROM operations WHERE id = ?1";
constexpr char kListUnfinishedOperations[] =
    "SELECT " SBX_OPERATION_COLS
    " FROM operations WHERE state IN ('pending', 'running') ORDER BY created_at, id";
constexpr char kListOperations[] =
    "SELECT " SBX_OPERATION_COLS " FROM operations WHERE sandbox_id = ?1 ORDER BY created_at, id";
constexpr char kPutOperation[] = "INSERT INTO operations (" SBX_OPERATION_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, kind = excluded.kind, sandbox_id = excluded.sandbox_id,
  state = excluded.state, error = excluded.error, result = excluded.result,
  created_at = excluded.created_at, updated_at = excluded.updated_at,
  completed_at = excluded.completed_at, initiator = excluded.initiator)sql";

constexpr char kGetSession[] = "SELECT " SBX_SESSION_COLS " FROM sessions WHERE id = ?1";
constexpr char kListSessions[] = "SELECT " SBX_SESSION_COLS
                                 " FROM sessions WHERE sandbox_id = ?1 ORDER BY created_at, id";
constexpr char kPutSession[] = "INSERT INTO sessions (" SBX_SESSION_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, sandbox_id = excluded.sandbox_id, state = excluded.state,
  spec = excluded.spec, exit_code = excluded.exit_code, signal = excluded.signal,
  timed_out = excluded.timed_out, oom_killed = excluded.oom_killed,
  created_at = excluded.created_at, started_at = excluded.started_at,
  exited_at = excluded.exited_at, error = excluded.error)sql";

constexpr char kGetIdempotency[] = "SELECT " SBX_IDEMPOTENCY_COLS
                                   " FROM idempotency_keys"
                                   " WHERE tenant_id = ?1 AND key = ?2 AND method = ?3"
                                   " AND route = ?4";
constexpr char kPutIdempotency[] = "INSERT INTO idempotency_keys (" SBX_IDEMPOTENCY_COLS R"sql()
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

#undef SBX_SANDBOX_COLS
#undef SBX_OPERATION_COLS
#undef SBX_SESSION_COLS
#undef SBX_IDEMPOTENCY_COLS

absl::StatusCode CodeForSqlite(int rc) {
  switch (rc) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE:
      return absl::StatusCode::kAlreadyExists;
    default:
      break;
  }
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_TOOBIG:
      return absl::StatusCode::kInvalidArgument;
    case SQLITE_CORRUPT:
      return absl::StatusCode::kDataLoss;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "store: <step>: <sqlite message>". Call before anything else touches the connection, since
// sqlite3_errmsg describes only the most recent call.
absl::Status SqliteError(sqlite3* db, int rc, std::string_view step) {
  // Prefer the connection's message (it names the constraint, the column, ...) but only when
  // it describes this failure: bind errors and a null handle leave it stale or absent.
  std::string msg = (db != nullptr && (sqlite3_extended_errcode(db) & 0xff) == (rc & 0xff))
                        ? sqlite3_errmsg(db)
                        : sqlite3_errstr(rc);
  return absl::Status(CodeForSqlite(rc), fmt::format("store: {}: {}", step, msg));
}

bool IsBusy(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

void BackoffSleep(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(10 << attempt));
}

// JSON null is stored as SQL NULL so "IS NULL" works in ad-hoc queries.
absl::Status BindJson(StmtCursor& q, int idx, const Json& j, std::string_view what) {
  if (j.is_null()) {
    q.BindNull(idx);
    return absl::OkStatus();
  }
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(fmt::format("store: {}: JSON value is discarded", what));
  }
  try {
    q.Bind(idx, j.dump());
  } catch (const Json::exception& e) {  // e.g. a string that is not valid UTF-8
    return absl::InvalidArgumentError(
        fmt::format("store: {}: cannot encode JSON: {}", what, e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ColumnJson(const StmtCursor& q, int col, std::string_view what) {
  if (q.IsNull(col)) return Json(nullptr);
  // sbxd's own rows: what it wrote, from values that were depth-checked on the way in.
  Json j = Json::parse(q.Text(col), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::DataLossError(fmt::format("store: {}: stored JSON does not parse", what));
  }
  return j;
}

absl::StatusOr<SandboxRecord> ReadSandbox(const StmtCursor& q) {
  SandboxRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.state = q.Text(2);
  r.template_ref = q.Text(3);
  r.template_digest = q.Text(4);
  r.runtime = q.Text(5);
  const std::string what = fmt::format("sandbox {}", r.id);
  SBX_ASSIGN_OR_RETURN(r.resources, ColumnJson(q, 6, what + " resources"));
  SBX_ASSIGN_OR_RETURN(r.effective_resources, ColumnJson(q, 7, what + " effective_resources"));
  r.egress_profile = q.Text(8);
  SBX_ASSIGN_OR_RETURN(r.env, ColumnJson(q, 9, what + " env"));
  SBX_ASSIGN_OR_RETURN(r.labels, ColumnJson(q, 10, what + " labels"));
  r.timeout_s = q.OptInt(11);
  r.created_at = q.Text(12);
  r.updated_at = q.Text(13);
  r.current_operation_id = q.OptText(14);
  SBX_ASSIGN_OR_RETURN(r.error, ColumnJson(q, 15, what + " error"));
  SBX_ASSIGN_OR_RETURN(r.runtime_state, ColumnJson(q, 16, what + " runtime_state"));
  r.idle_suspend_s = q.OptInt(17);
  return r;
}

absl::StatusOr<OperationRecord> ReadOperation(const StmtCursor& q) {
  OperationRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.kind = q.Text(2);
  r.sandbox_id = q.Text(3);
  r.state = q.Text(4);
  const std::string what = fmt::format("operation {}", r.id);
  SBX_ASSIGN_OR_RETURN(r.error, ColumnJson(q, 5, what + " error"));
  SBX_ASSIGN_OR_RETURN(r.result, ColumnJson(q, 6, what + " result"));
  r.created_at = q.Text(7);
  r.updated_at = q.Text(8);
  r.completed_at = q.OptText(9);
  r.initiator = q.Text(10);
  return r;
}

absl::StatusOr<SessionRecord> ReadSession(const StmtCursor& q) {
  SessionRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.sandbox_id = q.Text(2);
  r.state = q.Text(3);
  SBX_ASSIGN_OR_RETURN(r.spec, ColumnJson(q, 4, fmt::format("session {} spec", r.id)));
  if (auto code = q.OptInt(5)) r.exit_code = static_cast<int>(*code);
  r.signal = q.OptText(6);
  r.timed_out = q.Int(7) != 0;
  r.oom_killed = q.Int(8) != 0;
  r.created_at = q.Text(9);
  r.started_at = q.OptText(10);
  r.exited_at = q.OptText(11);
  SBX_ASSIGN_OR_RETURN(r.error, ColumnJson(q, 12, fmt::format("session {} error", r.id)));
  return r;
}

IdempotencyRecord ReadIdempotency(const StmtCursor& q) {
  IdempotencyRecord r;
  r.tenant_id = q.Text(0);
  r.key = q.Text(1);
  r.method = q.Text(2);
  r.route = q.Text(3);
  r.body_hash = q.Text(4);
  r.status = static_cast<int>(q.Int(5));
  r.response_body = q.Text(6);
  r.created_at = q.Text(7);
  return r;
}

// The page token is base64url(JSON ["<created_at>", "<id>"]) of the last row returned: the next
// page starts strictly after that position, so rows inserted meanwhile neither shift nor repeat.
std::string EncodePageToken(const SandboxRecord& last) {
  return Base64UrlEncode(Json::array({last.created_at, last.id}).dump());
}

std::optional<std::pair<std::string, std::string>> DecodePageToken(const std::string& token) {
  std::optional<std::string> raw = Base64UrlDecode(token);
  if (!raw) return std::nullopt;
  // The token comes back from the client (?page_token=): any bytes at all.
  auto parsed = ParseUntrustedJson(*raw);
  if (!parsed.ok()) return std::nullopt;
  const Json& j = *parsed;
  if (!j.is_array() || j.size() != 2 || !j[0].is_string() || !j[1].is_string()) {
    return std::nullopt;
  }
  return std::make_pair(j[0].get<std::string>(), j[1].get<std::string>());
}

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
  kCount,
};
constexpr std::string_view kQueryOpNames[] = {
    "Begin", "Commit", "GetSandbox", "ListSandboxes", "ListLiveSandboxes",
    "CountLiveSandboxesByState", "PutSandbox", "GetOperation", "PutOperation", "ListOperations",
    "ListUnfinishedOperations", "GetSession", "PutSession", "ListSessions", "GetIdempotency",
    "PutIdempotency", "PurgeIdempotency", "PurgeDeletedSandboxes",
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

  absl::Status Init();
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
  absl::StatusOr<int> ReadUserVersion(std::string_view step);

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

absl::StatusOr<int> SqliteStore::ReadUserVersion(std::string_view step) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db_.get(), "PRAGMA user_version", -1, &raw, nullptr);
  SqliteStmt stmt(raw);
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt.get());
  if (rc != SQLITE_ROW) return SqliteError(db_.get(), rc, step);
  return sqlite3_column_int(stmt.get(), 0);
}

absl::Status SqliteStore::Init() {
  sqlite3* db = db_.get();
  const std::string prefix = fmt::format("open {}", path_);
  auto fail = [&](int rc, std::string_view step) {
    return SqliteError(db, rc, fmt::format("{}: {}", prefix, step));
  };
  auto refuse_newer = [&](int version) {
    return absl::FailedPreconditionError(fmt::format(
        "store: open {}: schema version {} is newer than this binary supports ({}); "
        "refusing to open it (run a newer sbxd or restore a matching backup)",
        path_, version, kSchemaVersion));
  };
  auto exec = [&](const char* sql, std::string_view step) -> absl::Status {
    int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? absl::OkStatus() : fail(rc, step);
  };

  int rc = sqlite3_busy_timeout(db, kBusyTimeoutMs);
  if (rc != SQLITE_OK) return fail(rc, "set busy_timeout");

  // The first statement that reads the file: a non-database fails here with SQLITE_NOTADB, and
  // a newer schema is refused before this binary changes anything (such as the journal mode).
  SBX_ASSIGN_OR_RETURN(int version,
                       ReadUserVersion(fmt::format("{}: read schema version", prefix)));
  if (version > kSchemaVersion) return refuse_newer(version);

  {
    sqlite3_stmt* raw = nullptr;
    rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &raw, nullptr);
    SqliteStmt stmt(raw);
    if (rc == SQLITE_OK) rc = sqlite3_step(stmt.get());
    if (rc != SQLITE_ROW) return fail(rc, "set journal_mode=WAL");
    const auto* mode = reinterpret_cast<const char*>(sqlite3_column_text(stmt.get(), 0));
    std::string_view m = mode != nullptr ? mode : "";
    // In-memory databases cannot use WAL and report "memory"; anything else is a real failure.
    if (m != "wal" && m != "memory") {
      return absl::InternalError(
          fmt::format("store: {}: set journal_mode=WAL: SQLite kept journal mode '{}'", prefix, m));
    }
  }
  SBX_RETURN_IF_ERROR(exec("PRAGMA synchronous = NORMAL", "set synchronous=NORMAL"));
  SBX_RETURN_IF_ERROR(exec("PRAGMA foreign_keys = ON", "set foreign_keys=ON"));

  if (version == kSchemaVersion) return absl::OkStatus();

  // Migrate under a write lock, re-reading the version inside it: another process may have
  // migrated between our first read and the lock.
  for (int attempt = 0;; ++attempt) {
    rc = sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) break;
    if (!IsBusy(rc) || attempt >= kBusyRetries) return fail(rc, "migrate: begin");
    BackoffSleep(attempt);
  }
  auto migrate = [&]() -> absl::Status {
    SBX_ASSIGN_OR_RETURN(
        int v, ReadUserVersion(fmt::format("{}: migrate: read schema version", prefix)));
    if (v > kSchemaVersion) return refuse_newer(v);
    for (; v < kSchemaVersion; ++v) {
      SBX_RETURN_IF_ERROR(exec(kMigrations[v], fmt::format("migrate to version {}", v + 1)));
    }
    // PRAGMA takes no bound parameters; the value is a compile-time constant, not input.
    SBX_RETURN_IF_ERROR(exec(fmt::format("PRAGMA user_version = {}", kSchemaVersion).c_str(),
                             "migrate: set user_version"));
    return exec("COMMIT", "migrate: commit");
  };
  absl::Status st = migrate();
  if (!st.ok() && !sqlite3_get_autocommit(db)) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  return st;
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
    constexpr std::string_view kStep = "get sandbox";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kGetSandbox, kStep));
    StmtCursor q(stmt);
    q.Bind(1, id);
    int rc = q.Step();
    if (rc == SQLITE_DONE) return absl::NotFoundError(fmt::format("sandbox {} not found", id));
    if (rc != SQLITE_ROW) return Error(rc, kStep);
    return ReadSandbox(q);
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
    constexpr std::string_view kStep = "put sandbox";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kPutSandbox, kStep));
    StmtCursor q(stmt);
    const std::string what = fmt::format("put sandbox {}", r.id);
    q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.state).Bind(4, r.template_ref);
    q.Bind(5, r.template_digest).Bind(6, r.runtime);
    SBX_RETURN_IF_ERROR(BindJson(q, 7, r.resources, what + " resources"));
    SBX_RETURN_IF_ERROR(BindJson(q, 8, r.effective_resources, what + " effective_resources"));
    q.Bind(9, r.egress_profile);
    SBX_RETURN_IF_ERROR(BindJson(q, 10, r.env, what + " env"));
    SBX_RETURN_IF_ERROR(BindJson(q, 11, r.labels, what + " labels"));
    q.Bind(12, r.timeout_s).Bind(13, r.created_at).Bind(14, r.updated_at);
    q.Bind(15, r.current_operation_id);
    SBX_RETURN_IF_ERROR(BindJson(q, 16, r.error, what + " error"));
    SBX_RETURN_IF_ERROR(BindJson(q, 17, r.runtime_state, what + " runtime_state"));
    q.Bind(18, r.idle_suspend_s);
    return Done(q, kStep);
  }

  absl::StatusOr<OperationRecord> GetOperation(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetOperation));
    constexpr std::string_view kStep = "get operation";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kGetOperation, kStep));
    StmtCursor q(stmt);
    q.Bind(1, id);
    int rc = q.Step();
    if (rc == SQLITE_DONE) return absl::NotFoundError(fmt::format("operation {} not found", id));
    if (rc != SQLITE_ROW) return Error(rc, kStep);
    return ReadOperation(q);
  }

  absl::Status PutOperation(const OperationRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutOperation));
    constexpr std::string_view kStep = "put operation";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kPutOperation, kStep));
    StmtCursor q(stmt);
    const std::string what = fmt::format("put operation {}", r.id);
    q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.kind).Bind(4, r.sandbox_id).Bind(5, r.state);
    SBX_RETURN_IF_ERROR(BindJson(q, 6, r.error, what + " error"));
    SBX_RETURN_IF_ERROR(BindJson(q, 7, r.result, what + " result"));
    q.Bind(8, r.created_at).Bind(9, r.updated_at).Bind(10, r.completed_at);
    q.Bind(11, r.initiator);
    return Done(q, kStep);
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

  absl::StatusOr<SessionRecord> GetSession(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSession));
    constexpr std::string_view kStep = "get session";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kGetSession, kStep));
    StmtCursor q(stmt);
    q.Bind(1, id);
    int rc = q.Step();
    if (rc == SQLITE_DONE) return absl::NotFoundError(fmt::format("session {} not found", id));
    if (rc != SQLITE_ROW) return Error(rc, kStep);
    return ReadSession(q);
  }

  absl::Status PutSession(const SessionRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSession));
    constexpr std::string_view kStep = "put session";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kPutSession, kStep));
    StmtCursor q(stmt);
    q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.sandbox_id).Bind(4, r.state);
    SBX_RETURN_IF_ERROR(BindJson(q, 5, r.spec, fmt::format("put session {} spec", r.id)));
    q.Bind(6, r.exit_code).Bind(7, r.signal).Bind(8, r.timed_out).Bind(9, r.oom_killed);
    q.Bind(10, r.created_at).Bind(11, r.started_at).Bind(12, r.exited_at);
    SBX_RETURN_IF_ERROR(BindJson(q, 13, r.error, fmt::format("put session {} error", r.id)));
    return Done(q, kStep);
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
    constexpr std::string_view kStep = "put idempotency key";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kPutIdempotency, kStep));
    StmtCursor q(stmt);
    q.Bind(1, r.tenant_id).Bind(2, r.key).Bind(3, r.method).Bind(4, r.route);
    q.Bind(5, r.body_hash).Bind(6, r.status).Bind(7, r.response_body).Bind(8, r.created_at);
    return Done(q, kStep);
  }

  absl::StatusOr<int64_t> PurgeIdempotency(const std::string& before) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPurgeIdempotency));
    constexpr std::string_view kStep = "purge idempotency keys";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kPurgeIdempotency, kStep));
    StmtCursor q(stmt);
    q.Bind(1, before);
    SBX_RETURN_IF_ERROR(Done(q, kStep));
    return static_cast<int64_t>(sqlite3_changes64(store_.db()));
  }

  absl::StatusOr<int64_t> PurgeDeletedSandboxes(const std::string& before) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPurgeDeletedSandboxes));
    constexpr std::string_view kStep = "purge deleted sandboxes";
    for (const char* sql : {kPurgeDeletedSessions, kPurgeDeletedOperations}) {
      SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(sql, kStep));
      StmtCursor q(stmt);
      q.Bind(1, before);
      SBX_RETURN_IF_ERROR(Done(q, kStep));
    }
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kPurgeDeletedSandboxes, kStep));
    StmtCursor q(stmt);
    q.Bind(1, before);
    SBX_RETURN_IF_ERROR(Done(q, kStep));
    return static_cast<int64_t>(sqlite3_changes64(store_.db()));
  }

 private:
  absl::Status Error(int rc, std::string_view step) const {
    return SqliteError(store_.db(), rc, step);
  }

  absl::Status Done(StmtCursor& q, std::string_view step) const {
    int rc = q.Step();
    return rc == SQLITE_DONE ? absl::OkStatus() : Error(rc, step);
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
