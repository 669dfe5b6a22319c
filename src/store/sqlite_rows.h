// Store records and SQLite rows. A table's column list (SBX_STORE_*_COLS) fixes the order in
// which its Read* mapper reads a row of "SELECT <cols>" and its Bind* binder fills ?1..?N of
// "INSERT (<cols>) VALUES (?1, ...)". Internal to the store.
//
// JSON columns hold json::dump() text, or NULL for a JSON null (so "IS NULL" works in ad-hoc
// queries).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/sqlite_handle.h"
#include "store/store.h"

#define SBX_STORE_SANDBOX_COLS                                                               \
  "id, tenant_id, state, template_ref, template_digest, runtime, resources, "                \
  "effective_resources, egress_profile, env, labels, timeout_s, created_at, updated_at, "    \
  "current_operation_id, error, runtime_state, idle_suspend_s, egress, port_access"
#define SBX_STORE_OPERATION_COLS                                                           \
  "id, tenant_id, kind, sandbox_id, state, error, result, created_at, updated_at, "          \
  "completed_at, initiator, target, progress"
#define SBX_STORE_SESSION_COLS                                                               \
  "id, tenant_id, sandbox_id, state, spec, exit_code, signal, timed_out, oom_killed, "        \
  "created_at, started_at, exited_at, error"
#define SBX_STORE_IMAGE_COLS "digest, name, layers, config, source, size, created_at"
#define SBX_STORE_TAG_COLS "name, tag, digest, updated_at"
#define SBX_STORE_IDEMPOTENCY_COLS \
  "tenant_id, key, method, route, body_hash, status, response_body, created_at"
#define SBX_STORE_TENANT_COLS \
  "id, name, state, quotas, rate_limit, created_at, updated_at, egress_profiles"
#define SBX_STORE_TOKEN_COLS \
  "id, tenant_id, name, hash, scopes, expires_at, created_at, revoked_at"
#define SBX_STORE_AUDIT_COLS \
  "seq, time, tenant_id, token_id, action, target, status, code, request_id"

namespace sbx::store {

// Readers fail with DataLoss when a stored JSON column does not parse; binders with
// InvalidArgument when a JSON value cannot be encoded (a string that is not UTF-8).
absl::StatusOr<SandboxRecord> ReadSandbox(const StmtCursor& q);
absl::Status BindSandbox(StmtCursor& q, const SandboxRecord& r);

absl::StatusOr<OperationRecord> ReadOperation(const StmtCursor& q);
absl::Status BindOperation(StmtCursor& q, const OperationRecord& r);

absl::StatusOr<SessionRecord> ReadSession(const StmtCursor& q);
absl::Status BindSession(StmtCursor& q, const SessionRecord& r);

absl::StatusOr<ImageRecord> ReadImage(const StmtCursor& q);
absl::Status BindImage(StmtCursor& q, const ImageRecord& r);

absl::StatusOr<TagRecord> ReadTag(const StmtCursor& q);
absl::Status BindTag(StmtCursor& q, const TagRecord& r);

IdempotencyRecord ReadIdempotency(const StmtCursor& q);
absl::Status BindIdempotency(StmtCursor& q, const IdempotencyRecord& r);

absl::StatusOr<TenantRecord> ReadTenant(const StmtCursor& q);
absl::Status BindTenant(StmtCursor& q, const TenantRecord& r);

absl::StatusOr<TokenRecord> ReadToken(const StmtCursor& q);
absl::Status BindToken(StmtCursor& q, const TokenRecord& r);

absl::StatusOr<AuditRecord> ReadAudit(const StmtCursor& q);
// Binds ?1 (seq) to NULL whatever r.seq holds: SQLite assigns every line's seq.
absl::Status BindAudit(StmtCursor& q, const AuditRecord& r);

// The page token is base64url(JSON ["<created_at>", "<id>"]) of the last row returned: the
// next page starts strictly after that position, so rows inserted meanwhile neither shift nor
// repeat. Decoding returns nullopt for anything else (the token comes from the client).
std::string EncodePageToken(const SandboxRecord& last);
std::optional<std::pair<std::string, std::string>> DecodePageToken(const std::string& token);

}  // namespace sbx::store
