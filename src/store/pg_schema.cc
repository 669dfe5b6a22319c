#include "store/pg_schema.h"

#include <iterator>

#include <fmt/format.h>

namespace sbx::store {
namespace {

// PostgreSQL's schema, numbered like SQLite's (sqlite_schema.cc) so that one version means one
// set of tables and columns in both. A new database gets the baseline, which is SQLite's
// version 8 in one step (there was never a PostgreSQL database of an older version); each later
// change appends a migration here and in SQLite's list with the same number.
//
// Text that is sorted or compared (ids, names, RFC 3339 times) is COLLATE "C": byte order, as
// in SQLite, so page tokens and "ORDER BY created_at, id" agree between the backends whatever
// the database's locale. JSON stays text (json::dump()), as in SQLite; the few queries that look
// inside cast it to jsonb. Foreign keys are DEFERRABLE INITIALLY DEFERRED, as in SQLite.
constexpr int kBaselineVersion = 8;
constexpr char kBaseline[] = R"sql(
CREATE TABLE sandboxes (
  id                   TEXT COLLATE "C" PRIMARY KEY,
  tenant_id            TEXT COLLATE "C" NOT NULL,
  state                TEXT COLLATE "C" NOT NULL,
  template_ref         TEXT NOT NULL,
  template_digest      TEXT COLLATE "C" NOT NULL,
  runtime              TEXT NOT NULL,
  resources            TEXT,
  effective_resources  TEXT,
  egress_profile       TEXT NOT NULL,
  env                  TEXT,
  labels               TEXT,
  timeout_s            BIGINT,
  created_at           TEXT COLLATE "C" NOT NULL,
  updated_at           TEXT COLLATE "C" NOT NULL,
  current_operation_id TEXT,
  error                TEXT,
  runtime_state        TEXT,
  idle_suspend_s       BIGINT,
  egress               TEXT,
  port_access          TEXT
);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant_id, created_at, id);
CREATE INDEX sandboxes_live ON sandboxes (created_at, id) WHERE state <> 'deleted';
CREATE INDEX sandboxes_deleted ON sandboxes (updated_at) WHERE state = 'deleted';
CREATE INDEX sandboxes_by_digest ON sandboxes (template_digest) WHERE state <> 'deleted';
CREATE INDEX sandboxes_tenant_usage ON sandboxes (tenant_id)
  WHERE state NOT IN ('deleted', 'failed');

CREATE TABLE operations (
  id           TEXT COLLATE "C" PRIMARY KEY,
  tenant_id    TEXT COLLATE "C" NOT NULL,
  kind         TEXT NOT NULL,
  sandbox_id   TEXT COLLATE "C" NOT NULL,
  state        TEXT COLLATE "C" NOT NULL,
  error        TEXT,
  result       TEXT,
  created_at   TEXT COLLATE "C" NOT NULL,
  updated_at   TEXT COLLATE "C" NOT NULL,
  completed_at TEXT COLLATE "C",
  initiator    TEXT NOT NULL DEFAULT 'api',
  target       TEXT NOT NULL DEFAULT '',
  progress     TEXT
);
CREATE INDEX operations_by_state ON operations (state, created_at, id);
CREATE INDEX operations_by_sandbox ON operations (sandbox_id);

CREATE TABLE sessions (
  id         TEXT COLLATE "C" PRIMARY KEY,
  tenant_id  TEXT COLLATE "C" NOT NULL,
  sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id) DEFERRABLE INITIALLY DEFERRED,
  state      TEXT COLLATE "C" NOT NULL,
  spec       TEXT,
  exit_code  BIGINT,
  signal     TEXT,
  timed_out  BIGINT NOT NULL,
  oom_killed BIGINT NOT NULL,
  created_at TEXT COLLATE "C" NOT NULL,
  started_at TEXT,
  exited_at  TEXT,
  error      TEXT
);
CREATE INDEX sessions_by_sandbox ON sessions (sandbox_id, created_at, id);

CREATE TABLE idempotency_keys (
  tenant_id     TEXT COLLATE "C" NOT NULL,
  key           TEXT COLLATE "C" NOT NULL,
  method        TEXT COLLATE "C" NOT NULL,
  route         TEXT COLLATE "C" NOT NULL,
  body_hash     TEXT NOT NULL,
  status        BIGINT NOT NULL,
  response_body BYTEA NOT NULL,  -- any bytes, NUL included (TEXT refuses NUL)
  created_at    TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant_id, key, method, route)
);
CREATE INDEX idempotency_by_created ON idempotency_keys (created_at);

CREATE TABLE images (
  digest     TEXT COLLATE "C" PRIMARY KEY,
  name       TEXT COLLATE "C" NOT NULL,
  layers     TEXT NOT NULL,
  config     TEXT NOT NULL,
  source     TEXT NOT NULL,
  size       BIGINT NOT NULL,
  created_at TEXT COLLATE "C" NOT NULL
);
CREATE TABLE template_tags (
  name       TEXT COLLATE "C" NOT NULL,
  tag        TEXT COLLATE "C" NOT NULL,
  digest     TEXT COLLATE "C" NOT NULL REFERENCES images (digest) DEFERRABLE INITIALLY DEFERRED,
  updated_at TEXT NOT NULL,
  PRIMARY KEY (name, tag)
);
CREATE INDEX template_tags_by_digest ON template_tags (digest);

CREATE TABLE tenants (
  id              TEXT COLLATE "C" PRIMARY KEY,
  name            TEXT NOT NULL,
  state           TEXT NOT NULL,
  quotas          TEXT,
  rate_limit      TEXT,
  created_at      TEXT COLLATE "C" NOT NULL,
  updated_at      TEXT NOT NULL,
  egress_profiles TEXT
);
INSERT INTO tenants (id, name, state, quotas, rate_limit, created_at, updated_at)
  VALUES ('default', 'default', 'active', '{}', '{}',
          to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
          to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));

CREATE TABLE tokens (
  id         TEXT COLLATE "C" PRIMARY KEY,
  tenant_id  TEXT COLLATE "C" NOT NULL REFERENCES tenants (id) DEFERRABLE INITIALLY DEFERRED,
  name       TEXT NOT NULL,
  hash       TEXT NOT NULL,
  scopes     TEXT,
  expires_at TEXT,
  created_at TEXT COLLATE "C" NOT NULL,
  revoked_at TEXT
);
CREATE INDEX tokens_by_tenant ON tokens (tenant_id, created_at, id);

-- A seq comes from one counter row that AppendAudit updates inside the appending transaction,
-- not from a sequence: the row lock makes seqs commit in order, so a client paging with
-- after_seq never passes a line that a slower transaction commits later with a smaller seq.
CREATE TABLE audit_seq (id INTEGER PRIMARY KEY CHECK (id = 1), last BIGINT NOT NULL);
INSERT INTO audit_seq VALUES (1, 0);
CREATE TABLE audit_log (
  seq        BIGINT PRIMARY KEY,
  time       TEXT COLLATE "C" NOT NULL,
  tenant_id  TEXT COLLATE "C" NOT NULL,
  token_id   TEXT NOT NULL,
  action     TEXT NOT NULL,
  target     TEXT NOT NULL,
  status     BIGINT NOT NULL,
  code       TEXT NOT NULL,
  request_id TEXT NOT NULL
);
CREATE INDEX audit_by_tenant ON audit_log (tenant_id, seq);
CREATE INDEX audit_by_time ON audit_log (time);
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE ON audit_log
  FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
)sql";

// Entry 0 stands for the baseline; entry i (i >= 1) upgrades version kBaselineVersion + i - 1
// to the next. Append only, in step with SQLite's list.
// 9: nodes (issue 21), as SQLite's 9.
constexpr char kNodes[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN node TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN node TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_node ON sandboxes (node) WHERE state <> 'deleted';
CREATE INDEX operations_unfinished ON operations (node) WHERE state IN ('pending', 'running');
CREATE TABLE nodes (
  name         TEXT COLLATE "C" PRIMARY KEY,
  url          TEXT NOT NULL,
  role         TEXT NOT NULL,
  state        TEXT NOT NULL,
  epoch        BIGINT NOT NULL,
  heartbeat_at TEXT COLLATE "C" NOT NULL,
  started_at   TEXT NOT NULL,
  capacity     TEXT,
  load         TEXT,
  labels       TEXT,
  reason       TEXT NOT NULL DEFAULT ''
);
)sql";

// 10: a node's restart deadline (issue 21), as SQLite's 10.
constexpr char kNodeRestart[] = R"sql(
ALTER TABLE nodes ADD COLUMN restart_by TEXT COLLATE "C" NOT NULL DEFAULT '';
)sql";

constexpr const char* kMigrations[] = {kBaseline, kNodes, kNodeRestart};
constexpr int kSchemaVersion = kBaselineVersion + static_cast<int>(std::size(kMigrations)) - 1;

// Every sbxd sharing the database takes this lock before it reads or changes the version, so
// two that start together migrate once. A constant: "sbx schema" in ASCII.
constexpr int64_t kMigrationLock = 0x736278736368656d;

}  // namespace

int PgSchemaVersion() { return kSchemaVersion; }

absl::Status PreparePgSchema(pqxx::connection& conn, const std::string& where) {
  pqxx::work tx(conn);
  tx.exec_params("SELECT pg_advisory_xact_lock($1)", kMigrationLock);
  tx.exec(
      "CREATE TABLE IF NOT EXISTS sbx_schema_migrations ("
      " version INTEGER PRIMARY KEY,"
      " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())");
  pqxx::row row = tx.exec1("SELECT COALESCE(MAX(version), 0) FROM sbx_schema_migrations");
  int version = row[0].as<int>();
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(fmt::format(
        "store: open {}: schema version {} is newer than this binary supports ({}); refusing "
        "to use it (run a newer sbxd or restore a matching backup)",
        where, version, kSchemaVersion));
  }
  if (version == kSchemaVersion) return absl::OkStatus();  // the work rolls back: nothing to do
  if (version == 0) {
    tx.exec(kBaseline);
    version = kBaselineVersion;
    tx.exec_params("INSERT INTO sbx_schema_migrations (version) VALUES ($1)", version);
  }
  for (; version < kSchemaVersion; ++version) {
    tx.exec(kMigrations[version - kBaselineVersion + 1]);
    tx.exec_params("INSERT INTO sbx_schema_migrations (version) VALUES ($1)", version + 1);
  }
  tx.commit();
  return absl::OkStatus();
}

}  // namespace sbx::store
