#include "store/sqlite_schema.h"

#include <iterator>
#include <string_view>

#include <fmt/format.h>

#include "common/status_util.h"
#include "store/sqlite_handle.h"

namespace sbx::store {
namespace {

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
    // 4: a networked sandbox's egress as resolved at create (profile and narrowing), so a
    // later configuration change never widens it; null: `none`.
    R"sql(
ALTER TABLE sandboxes ADD COLUMN egress TEXT;
)sql",
    // 5: who may reach the sandbox's ports through sbxd: {"traffic_token", "public"}, kept so
    // that the token a client holds survives an sbxd restart; null: a sandbox made before.
    R"sql(
ALTER TABLE sandboxes ADD COLUMN port_access TEXT;
)sql",
    // 6: templates from OCI images (issue 17). Template operations have no sandbox, so the
    // operations table is rebuilt without its foreign key (SQLite cannot drop one), with the
    // template an operation makes (`target`) and its last progress snapshot.
    R"sql(
CREATE TABLE operations_new (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL,
  kind         TEXT NOT NULL,
  sandbox_id   TEXT NOT NULL,
  state        TEXT NOT NULL,
  error        TEXT,
  result       TEXT,
  created_at   TEXT NOT NULL,
  updated_at   TEXT NOT NULL,
  completed_at TEXT,
  initiator    TEXT NOT NULL DEFAULT 'api',
  target       TEXT NOT NULL DEFAULT '',
  progress     TEXT
) STRICT;
INSERT INTO operations_new (id, tenant_id, kind, sandbox_id, state, error, result, created_at,
                            updated_at, completed_at, initiator)
  SELECT id, tenant_id, kind, sandbox_id, state, error, result, created_at, updated_at,
         completed_at, initiator FROM operations;
DROP TABLE operations;
ALTER TABLE operations_new RENAME TO operations;
CREATE INDEX operations_by_state ON operations (state, created_at, id);
CREATE INDEX operations_by_sandbox ON operations (sandbox_id);

CREATE TABLE images (
  digest     TEXT PRIMARY KEY,
  name       TEXT NOT NULL,
  layers     TEXT NOT NULL,
  config     TEXT NOT NULL,
  source     TEXT NOT NULL,
  size       INTEGER NOT NULL,
  created_at TEXT NOT NULL
) STRICT;
CREATE TABLE template_tags (
  name       TEXT NOT NULL,
  tag        TEXT NOT NULL,
  digest     TEXT NOT NULL REFERENCES images (digest) DEFERRABLE INITIALLY DEFERRED,
  updated_at TEXT NOT NULL,
  PRIMARY KEY (name, tag)
) STRICT;
CREATE INDEX template_tags_by_digest ON template_tags (digest);
CREATE INDEX sandboxes_by_digest ON sandboxes (template_digest) WHERE state <> 'deleted';
)sql",
    // 7: tenancy (issue 18): tenants with their quotas, management tokens (their hash only) and
    // the audit log. "default" is inserted so that every sandbox made before has its tenant.
    // Audit seqs use AUTOINCREMENT so that a seq is never reused, even after a future retention
    // purge: a client paging with after_seq never skips a line. A row is never updated (the
    // trigger); sandboxes_tenant_usage makes GetTenantUsage visit the tenant's live rows only
    // (the same condition as its WHERE).
    R"sql(
CREATE TABLE tenants (
  id         TEXT PRIMARY KEY,
  name       TEXT NOT NULL,
  state      TEXT NOT NULL,
  quotas     TEXT,
  rate_limit TEXT,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL
) STRICT;
INSERT INTO tenants (id, name, state, quotas, rate_limit, created_at, updated_at)
  VALUES ('default', 'default', 'active', '{}', '{}', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
          strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));

CREATE TABLE tokens (
  id         TEXT PRIMARY KEY,
  tenant_id  TEXT NOT NULL REFERENCES tenants (id) DEFERRABLE INITIALLY DEFERRED,
  name       TEXT NOT NULL,
  hash       TEXT NOT NULL,
  scopes     TEXT,
  expires_at TEXT,
  created_at TEXT NOT NULL,
  revoked_at TEXT
) STRICT;
CREATE INDEX tokens_by_tenant ON tokens (tenant_id, created_at, id);

CREATE TABLE audit_log (
  seq        INTEGER PRIMARY KEY AUTOINCREMENT,
  time       TEXT NOT NULL,
  tenant_id  TEXT NOT NULL,
  token_id   TEXT NOT NULL,
  action     TEXT NOT NULL,
  target     TEXT NOT NULL,
  status     INTEGER NOT NULL,
  code       TEXT NOT NULL,
  request_id TEXT NOT NULL
) STRICT;
CREATE INDEX audit_by_tenant ON audit_log (tenant_id, seq);
CREATE INDEX audit_by_time ON audit_log (time);
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
  BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;

CREATE INDEX sandboxes_tenant_usage ON sandboxes (tenant_id)
  WHERE state NOT IN ('deleted', 'failed');
)sql",
    // 8: the egress profiles a tenant may use (issue 18); NULL, as every existing row reads,
    // is every profile of the deployment.
    R"sql(
ALTER TABLE tenants ADD COLUMN egress_profiles TEXT;
)sql",
    // 9: nodes (issue 21, docs/scale.md): which node holds each sandbox and runs each
    // operation, and the nodes' registrations. Existing rows get node '' (claimed by the next
    // single-host sbxd to start).
    R"sql(
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN node TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_node ON sandboxes (node) WHERE state <> 'deleted';
CREATE INDEX operations_unfinished ON operations (node) WHERE state IN ('pending', 'running');
CREATE TABLE nodes (
  name         TEXT PRIMARY KEY,
  url          TEXT NOT NULL,
  role         TEXT NOT NULL,
  state        TEXT NOT NULL,
  epoch        INTEGER NOT NULL,
  heartbeat_at TEXT NOT NULL,
  started_at   TEXT NOT NULL,
  capacity     TEXT,
  load         TEXT,
  labels       TEXT,
  reason       TEXT NOT NULL DEFAULT ''
);
)sql",
    // 10: a node's restart deadline (issue 21, docs/scale.md "Rolling restarts"): a node
    // stopped on purpose is not declared lost before it.
    R"sql(
ALTER TABLE nodes ADD COLUMN restart_by TEXT NOT NULL DEFAULT '';
)sql",
};
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

absl::StatusOr<int> ReadUserVersion(sqlite3* db, std::string_view step) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &raw, nullptr);
  SqliteStmt stmt(raw);
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt.get());
  if (rc != SQLITE_ROW) return SqliteError(db, rc, step);
  return sqlite3_column_int(stmt.get(), 0);
}

// What one connection needs, prefixed "store: open <path>: " in messages.
class SchemaSetup {
 public:
  SchemaSetup(sqlite3* db, const std::string& path)
      : db_(db), path_(path), prefix_(fmt::format("open {}", path)) {}

  absl::Status Run() {
    int rc = sqlite3_busy_timeout(db_, kBusyTimeoutMs);
    if (rc != SQLITE_OK) return Fail(rc, "set busy_timeout");

    // The first statement that reads the file: a non-database fails here with SQLITE_NOTADB,
    // and a newer schema is refused before this binary changes anything (such as the journal
    // mode).
    SBX_ASSIGN_OR_RETURN(int version,
                         ReadUserVersion(db_, fmt::format("{}: read schema version", prefix_)));
    if (version > kSchemaVersion) return RefuseNewer(version);

    SBX_RETURN_IF_ERROR(SetWal());
    SBX_RETURN_IF_ERROR(Exec("PRAGMA synchronous = NORMAL", "set synchronous=NORMAL"));
    SBX_RETURN_IF_ERROR(Exec("PRAGMA foreign_keys = ON", "set foreign_keys=ON"));

    if (version == kSchemaVersion) return absl::OkStatus();
    return MigrateLocked();
  }

 private:
  absl::Status Fail(int rc, std::string_view step) const {
    return SqliteError(db_, rc, fmt::format("{}: {}", prefix_, step));
  }

  absl::Status RefuseNewer(int version) const {
    return absl::FailedPreconditionError(fmt::format(
        "store: open {}: schema version {} is newer than this binary supports ({}); "
        "refusing to open it (run a newer sbxd or restore a matching backup)",
        path_, version, kSchemaVersion));
  }

  absl::Status Exec(const char* sql, std::string_view step) const {
    int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? absl::OkStatus() : Fail(rc, step);
  }

  absl::Status SetWal() const {
    sqlite3_stmt* raw = nullptr;
    int rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode = WAL", -1, &raw, nullptr);
    SqliteStmt stmt(raw);
    if (rc == SQLITE_OK) rc = sqlite3_step(stmt.get());
    if (rc != SQLITE_ROW) return Fail(rc, "set journal_mode=WAL");
    const auto* mode = reinterpret_cast<const char*>(sqlite3_column_text(stmt.get(), 0));
    std::string_view m = mode != nullptr ? mode : "";
    // In-memory databases cannot use WAL and report "memory"; anything else is a real failure.
    if (m != "wal" && m != "memory") {
      return absl::InternalError(fmt::format(
          "store: {}: set journal_mode=WAL: SQLite kept journal mode '{}'", prefix_, m));
    }
    return absl::OkStatus();
  }

  // Migrates under a write lock, re-reading the version inside it: another process may have
  // migrated between our first read and the lock.
  absl::Status MigrateLocked() const {
    for (int attempt = 0;; ++attempt) {
      int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
      if (rc == SQLITE_OK) break;
      if (!IsBusy(rc) || attempt >= kBusyRetries) return Fail(rc, "migrate: begin");
      BackoffSleep(attempt);
    }
    absl::Status st = Migrate();
    if (!st.ok() && !sqlite3_get_autocommit(db_)) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    return st;
  }

  absl::Status Migrate() const {
    SBX_ASSIGN_OR_RETURN(
        int v, ReadUserVersion(db_, fmt::format("{}: migrate: read schema version", prefix_)));
    if (v > kSchemaVersion) return RefuseNewer(v);
    for (; v < kSchemaVersion; ++v) {
      SBX_RETURN_IF_ERROR(Exec(kMigrations[v], fmt::format("migrate to version {}", v + 1)));
    }
    // PRAGMA takes no bound parameters; the value is a compile-time constant, not input.
    SBX_RETURN_IF_ERROR(Exec(fmt::format("PRAGMA user_version = {}", kSchemaVersion).c_str(),
                             "migrate: set user_version"));
    return Exec("COMMIT", "migrate: commit");
  }

  sqlite3* db_;
  const std::string& path_;
  const std::string prefix_;
};

}  // namespace

absl::Status PrepareSchema(sqlite3* db, const std::string& path) {
  return SchemaSetup(db, path).Run();
}

}  // namespace sbx::store
