// The SQL both store backends run, written once. SQLite runs it as is; the PostgreSQL store
// rewrites ?N to $N when it prepares a statement, and has its own text only where the dialects
// differ (JSON functions, the audit sequence): see pg_store.cc. Each constant is a named array
// because the backends cache prepared statements by its address. Internal to the store.
#pragma once

#include "store/rows.h"

namespace sbx::store::sql {

inline constexpr char kGetSandbox[] = "SELECT " SBX_STORE_SANDBOX_COLS " FROM sandboxes WHERE id = ?1";
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
inline constexpr char kListSandboxesFirst[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                       SBX_LIST_SANDBOXES_WHERE
                                       " ORDER BY created_at, id LIMIT ?6";
inline constexpr char kListSandboxesAfter[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                       SBX_LIST_SANDBOXES_WHERE
                                       " AND (created_at, id) > (?7, ?8)"
                                       " ORDER BY created_at, id LIMIT ?6";
#undef SBX_LIST_SANDBOXES_WHERE
inline constexpr char kListLiveSandboxes[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                      " FROM sandboxes WHERE state <> 'deleted' AND node = ?1"
                                      " ORDER BY created_at, id";
// Rows of no node (before schema 9) go to the single-host sbxd that asks.
inline constexpr char kClaimUnassignedSandboxes[] =
    "UPDATE sandboxes SET node = ?1 WHERE node = '' AND state <> 'deleted'";
inline constexpr char kClaimUnassignedOperations[] =
    "UPDATE operations SET node = ?1 WHERE node = '' AND state IN ('pending', 'running')";
inline constexpr char kCountHeldByNode[] =
    "SELECT node, COUNT(*) FROM sandboxes WHERE state NOT IN ('deleted', 'failed', 'lost')"
    " GROUP BY node";
// Visits the tenant's rows (sandboxes_by_tenant); json_each as in the list above.
inline constexpr char kCountLabelledByNode[] =
    "SELECT node, COUNT(*) FROM sandboxes WHERE tenant_id = ?1"
    " AND state NOT IN ('deleted', 'failed', 'lost')"
    " AND EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l"
    "             WHERE l.key = ?2 AND l.type = 'text' AND l.value = ?3)"
    " GROUP BY node";
inline constexpr char kGetNode[] = "SELECT " SBX_STORE_NODE_COLS " FROM nodes WHERE name = ?1";
inline constexpr char kListNodes[] = "SELECT " SBX_STORE_NODE_COLS " FROM nodes ORDER BY name";
inline constexpr char kPutNode[] = "INSERT INTO nodes (" SBX_STORE_NODE_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
ON CONFLICT (name) DO UPDATE SET
  url = excluded.url, role = excluded.role, state = excluded.state, epoch = excluded.epoch,
  heartbeat_at = excluded.heartbeat_at, started_at = excluded.started_at,
  capacity = excluded.capacity, load = excluded.load, labels = excluded.labels,
  reason = excluded.reason, restart_by = excluded.restart_by)sql";
// The partial index sandboxes_live has the same condition, so only live rows are visited.
inline constexpr char kCountLiveSandboxesByState[] =
    "SELECT state, COUNT(*) FROM sandboxes WHERE state <> 'deleted' GROUP BY state";
inline constexpr char kPutSandbox[] = "INSERT INTO sandboxes (" SBX_STORE_SANDBOX_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, state = excluded.state,
  template_ref = excluded.template_ref, template_digest = excluded.template_digest,
  runtime = excluded.runtime, resources = excluded.resources,
  effective_resources = excluded.effective_resources, egress_profile = excluded.egress_profile,
  env = excluded.env, labels = excluded.labels, timeout_s = excluded.timeout_s,
  created_at = excluded.created_at, updated_at = excluded.updated_at,
  current_operation_id = excluded.current_operation_id, error = excluded.error,
  runtime_state = excluded.runtime_state, idle_suspend_s = excluded.idle_suspend_s,
  egress = excluded.egress, port_access = excluded.port_access, node = excluded.node
WHERE sandboxes.state <> 'lost' OR excluded.state IN ('lost', 'deleting', 'deleted'))sql";

inline constexpr char kGetOperation[] =
    "SELECT " SBX_STORE_OPERATION_COLS " FROM operations WHERE id = ?1";
inline constexpr char kListUnfinishedOperations[] =
    "SELECT " SBX_STORE_OPERATION_COLS
    " FROM operations WHERE state IN ('pending', 'running') AND node = ?1"
    " ORDER BY created_at, id";
inline constexpr char kListOperations[] = "SELECT " SBX_STORE_OPERATION_COLS
                                   " FROM operations WHERE sandbox_id = ?1"
                                   " ORDER BY created_at, id";
inline constexpr char kPutOperation[] = "INSERT INTO operations (" SBX_STORE_OPERATION_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, kind = excluded.kind, sandbox_id = excluded.sandbox_id,
  state = excluded.state, error = excluded.error, result = excluded.result,
  created_at = excluded.created_at, updated_at = excluded.updated_at,
  completed_at = excluded.completed_at, initiator = excluded.initiator,
  target = excluded.target, progress = excluded.progress, node = excluded.node
WHERE operations.state NOT IN ('succeeded', 'failed'))sql";

inline constexpr char kGetImage[] = "SELECT " SBX_STORE_IMAGE_COLS " FROM images WHERE digest = ?1";
inline constexpr char kPutImage[] = "INSERT INTO images (" SBX_STORE_IMAGE_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (digest) DO UPDATE SET
  name = excluded.name, layers = excluded.layers, config = excluded.config,
  source = excluded.source, size = excluded.size, created_at = excluded.created_at)sql";
inline constexpr char kDeleteImage[] = "DELETE FROM images WHERE digest = ?1";
inline constexpr char kListImages[] =
    "SELECT " SBX_STORE_IMAGE_COLS " FROM images ORDER BY created_at, digest";
inline constexpr char kGetTag[] =
    "SELECT " SBX_STORE_TAG_COLS " FROM template_tags WHERE name = ?1 AND tag = ?2";
inline constexpr char kPutTag[] = "INSERT INTO template_tags (" SBX_STORE_TAG_COLS R"sql()
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (name, tag) DO UPDATE SET
  digest = excluded.digest, updated_at = excluded.updated_at)sql";
inline constexpr char kDeleteTag[] = "DELETE FROM template_tags WHERE name = ?1 AND tag = ?2";
inline constexpr char kListTags[] = "SELECT " SBX_STORE_TAG_COLS " FROM template_tags ORDER BY name, tag";
inline constexpr char kCountLiveWithDigest[] =
    "SELECT COUNT(*) FROM sandboxes WHERE template_digest = ?1 AND state <> 'deleted'";

inline constexpr char kGetSession[] = "SELECT " SBX_STORE_SESSION_COLS " FROM sessions WHERE id = ?1";
inline constexpr char kListSessions[] = "SELECT " SBX_STORE_SESSION_COLS
                                 " FROM sessions WHERE sandbox_id = ?1 ORDER BY created_at, id";
inline constexpr char kPutSession[] = "INSERT INTO sessions (" SBX_STORE_SESSION_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, sandbox_id = excluded.sandbox_id, state = excluded.state,
  spec = excluded.spec, exit_code = excluded.exit_code, signal = excluded.signal,
  timed_out = excluded.timed_out, oom_killed = excluded.oom_killed,
  created_at = excluded.created_at, started_at = excluded.started_at,
  exited_at = excluded.exited_at, error = excluded.error)sql";

inline constexpr char kGetIdempotency[] = "SELECT " SBX_STORE_IDEMPOTENCY_COLS
                                   " FROM idempotency_keys"
                                   " WHERE tenant_id = ?1 AND key = ?2 AND method = ?3"
                                   " AND route = ?4";
inline constexpr char kPutIdempotency[] =
    "INSERT INTO idempotency_keys (" SBX_STORE_IDEMPOTENCY_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (tenant_id, key, method, route) DO UPDATE SET
  body_hash = excluded.body_hash, status = excluded.status,
  response_body = excluded.response_body, created_at = excluded.created_at)sql";
inline constexpr char kPurgeIdempotency[] = "DELETE FROM idempotency_keys WHERE created_at < ?1";
// Children first: the foreign keys are checked at COMMIT, but a dangling row must never exist.
inline constexpr char kPurgeDeletedSessions[] =
    "DELETE FROM sessions WHERE sandbox_id IN"
    " (SELECT id FROM sandboxes WHERE state = 'deleted' AND updated_at < ?1)";
inline constexpr char kPurgeDeletedOperations[] =
    "DELETE FROM operations WHERE sandbox_id IN"
    " (SELECT id FROM sandboxes WHERE state = 'deleted' AND updated_at < ?1)";
inline constexpr char kPurgeDeletedSandboxes[] =
    "DELETE FROM sandboxes WHERE state = 'deleted' AND updated_at < ?1";
// Template operations (imports, pulls, builds) have no sandbox to go with: a finished one goes
// after the same retention as a deleted sandbox's, counted from its end.
inline constexpr char kPurgeTemplateOperations[] =
    "DELETE FROM operations WHERE sandbox_id = '' AND state IN ('succeeded', 'failed')"
    " AND completed_at IS NOT NULL AND completed_at < ?1";

inline constexpr char kGetTenant[] = "SELECT " SBX_STORE_TENANT_COLS " FROM tenants WHERE id = ?1";
inline constexpr char kPutTenant[] = "INSERT INTO tenants (" SBX_STORE_TENANT_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (id) DO UPDATE SET
  name = excluded.name, state = excluded.state, quotas = excluded.quotas,
  rate_limit = excluded.rate_limit, created_at = excluded.created_at,
  updated_at = excluded.updated_at, egress_profiles = excluded.egress_profiles)sql";
inline constexpr char kListTenants[] =
    "SELECT " SBX_STORE_TENANT_COLS " FROM tenants ORDER BY created_at, id";
inline constexpr char kDeleteTenant[] = "DELETE FROM tenants WHERE id = ?1";
inline constexpr char kDeleteTenantTokens[] = "DELETE FROM tokens WHERE tenant_id = ?1";
inline constexpr char kGetToken[] = "SELECT " SBX_STORE_TOKEN_COLS " FROM tokens WHERE id = ?1";
inline constexpr char kPutToken[] = "INSERT INTO tokens (" SBX_STORE_TOKEN_COLS R"sql()
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (id) DO UPDATE SET
  tenant_id = excluded.tenant_id, name = excluded.name, hash = excluded.hash,
  scopes = excluded.scopes, expires_at = excluded.expires_at, created_at = excluded.created_at,
  revoked_at = excluded.revoked_at)sql";
inline constexpr char kListTokens[] = "SELECT " SBX_STORE_TOKEN_COLS
                               " FROM tokens WHERE tenant_id = ?1 ORDER BY created_at, id";
// No upsert: a line is only ever appended (and the table's trigger refuses updates).
inline constexpr char kAppendAudit[] = "INSERT INTO audit_log (" SBX_STORE_AUDIT_COLS
                                ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
// ?1 tenant (the "Tenant" variant only), ?2 since, ?3 after_seq, ?4 limit. Two statements so
// that one tenant's page seeks in audit_by_tenant; all tenants' walks the seq (rowid) order.
inline constexpr char kListAuditAll[] = "SELECT " SBX_STORE_AUDIT_COLS
                                 " FROM audit_log WHERE seq > ?3 AND time >= ?2"
                                 " ORDER BY seq LIMIT ?4";
inline constexpr char kListAuditTenant[] = "SELECT " SBX_STORE_AUDIT_COLS
                                    " FROM audit_log WHERE tenant_id = ?1 AND seq > ?3"
                                    " AND time >= ?2 ORDER BY seq LIMIT ?4";
// The WHERE repeats sandboxes_tenant_usage's condition word for word, so SQLite may use that
// partial index. A suspended sandbox holds its disk only; a missing key (or a null
// effective_resources) counts 0.
inline constexpr char kGetTenantUsage[] = R"sql(SELECT COUNT(*),
  IFNULL(SUM(CASE WHEN state = 'suspended' THEN 0
                  ELSE IFNULL(json_extract(effective_resources, '$.vcpu'), 0) END), 0),
  IFNULL(SUM(CASE WHEN state = 'suspended' THEN 0
                  ELSE IFNULL(json_extract(effective_resources, '$.memory_mib'), 0) END), 0),
  IFNULL(SUM(IFNULL(json_extract(effective_resources, '$.disk_mib'), 0)), 0)
FROM sandboxes WHERE tenant_id = ?1 AND state NOT IN ('deleted', 'failed') AND state <> 'lost')sql";
inline constexpr char kCountLiveSessions[] =
    "SELECT COUNT(*) FROM sessions WHERE sandbox_id = ?1 AND state <> 'exited'";

}  // namespace sbx::store::sql
