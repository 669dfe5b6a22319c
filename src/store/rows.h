// Store records and table rows, shared by both backends. A table's column list
// (SBX_STORE_*_COLS) fixes the order in which its Read* mapper reads a row of "SELECT <cols>" and
// its Bind* binder fills parameters 1..N of "INSERT (<cols>) VALUES (...)". Internal to the store.
//
// The mappers are templates over the backend's row and parameter types, so SQLite and
// PostgreSQL cannot disagree on a column's meaning:
//   Row:    IsNull(col), Text(col), OptText(col), Int(col), OptInt(col)   (0-based)
//   Params: Bind(idx, string|int64|int|bool|optional<...>), BindNull(idx)  (1-based)
//
// JSON columns hold json::dump() text, or NULL for a JSON null (so "IS NULL" works in ad-hoc
// queries). Readers fail with DataLoss when a stored JSON column does not parse; binders with
// InvalidArgument when a JSON value cannot be encoded (a string that is not UTF-8).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_util.h"
#include "store/store.h"

#define SBX_STORE_SANDBOX_COLS                                                               \
  "id, tenant_id, state, template_ref, template_digest, runtime, resources, "                \
  "effective_resources, egress_profile, env, labels, timeout_s, created_at, updated_at, "    \
  "current_operation_id, error, runtime_state, idle_suspend_s, egress, port_access, node"
#define SBX_STORE_OPERATION_COLS                                                           \
  "id, tenant_id, kind, sandbox_id, state, error, result, created_at, updated_at, "          \
  "completed_at, initiator, target, progress, node"
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
#define SBX_STORE_NODE_COLS \
  "name, url, role, state, epoch, heartbeat_at, started_at, capacity, load, labels, reason, " \
  "restart_by"
#define SBX_STORE_AUDIT_COLS \
  "seq, time, tenant_id, token_id, action, target, status, code, request_id"

namespace sbx::store {

namespace rows_internal {

template <typename Params>
absl::Status BindJson(Params& q, int idx, const Json& j, std::string_view what) {
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

template <typename Row>
absl::StatusOr<Json> ColumnJson(const Row& q, int col, std::string_view what) {
  if (q.IsNull(col)) return Json(nullptr);
  // sbxd's own rows: what it wrote, from values that were depth-checked on the way in.
  Json j = Json::parse(q.Text(col), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::DataLossError(fmt::format("store: {}: stored JSON does not parse", what));
  }
  return j;
}

}  // namespace rows_internal

template <typename Row>
absl::StatusOr<SandboxRecord> ReadSandbox(const Row& q) {
  SandboxRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.state = q.Text(2);
  r.template_ref = q.Text(3);
  r.template_digest = q.Text(4);
  r.runtime = q.Text(5);
  const std::string what = fmt::format("sandbox {}", r.id);
  SBX_ASSIGN_OR_RETURN(r.resources, rows_internal::ColumnJson(q, 6, what + " resources"));
  SBX_ASSIGN_OR_RETURN(r.effective_resources, rows_internal::ColumnJson(q, 7, what + " effective_resources"));
  r.egress_profile = q.Text(8);
  SBX_ASSIGN_OR_RETURN(r.env, rows_internal::ColumnJson(q, 9, what + " env"));
  SBX_ASSIGN_OR_RETURN(r.labels, rows_internal::ColumnJson(q, 10, what + " labels"));
  r.timeout_s = q.OptInt(11);
  r.created_at = q.Text(12);
  r.updated_at = q.Text(13);
  r.current_operation_id = q.OptText(14);
  SBX_ASSIGN_OR_RETURN(r.error, rows_internal::ColumnJson(q, 15, what + " error"));
  SBX_ASSIGN_OR_RETURN(r.runtime_state, rows_internal::ColumnJson(q, 16, what + " runtime_state"));
  r.idle_suspend_s = q.OptInt(17);
  SBX_ASSIGN_OR_RETURN(r.egress, rows_internal::ColumnJson(q, 18, what + " egress"));
  SBX_ASSIGN_OR_RETURN(r.port_access, rows_internal::ColumnJson(q, 19, what + " port_access"));
  r.node = q.Text(20);
  return r;
}

template <typename Params>
absl::Status BindSandbox(Params& q, const SandboxRecord& r) {
  const std::string what = fmt::format("put sandbox {}", r.id);
  q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.state).Bind(4, r.template_ref);
  q.Bind(5, r.template_digest).Bind(6, r.runtime);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 7, r.resources, what + " resources"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 8, r.effective_resources, what + " effective_resources"));
  q.Bind(9, r.egress_profile);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 10, r.env, what + " env"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 11, r.labels, what + " labels"));
  q.Bind(12, r.timeout_s).Bind(13, r.created_at).Bind(14, r.updated_at);
  q.Bind(15, r.current_operation_id);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 16, r.error, what + " error"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 17, r.runtime_state, what + " runtime_state"));
  q.Bind(18, r.idle_suspend_s);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 19, r.egress, what + " egress"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 20, r.port_access, what + " port_access"));
  q.Bind(21, r.node);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<OperationRecord> ReadOperation(const Row& q) {
  OperationRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.kind = q.Text(2);
  r.sandbox_id = q.Text(3);
  r.state = q.Text(4);
  const std::string what = fmt::format("operation {}", r.id);
  SBX_ASSIGN_OR_RETURN(r.error, rows_internal::ColumnJson(q, 5, what + " error"));
  SBX_ASSIGN_OR_RETURN(r.result, rows_internal::ColumnJson(q, 6, what + " result"));
  r.created_at = q.Text(7);
  r.updated_at = q.Text(8);
  r.completed_at = q.OptText(9);
  r.initiator = q.Text(10);
  r.target = q.Text(11);
  SBX_ASSIGN_OR_RETURN(r.progress, rows_internal::ColumnJson(q, 12, what + " progress"));
  r.node = q.Text(13);
  return r;
}

template <typename Params>
absl::Status BindOperation(Params& q, const OperationRecord& r) {
  const std::string what = fmt::format("put operation {}", r.id);
  q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.kind).Bind(4, r.sandbox_id).Bind(5, r.state);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 6, r.error, what + " error"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 7, r.result, what + " result"));
  q.Bind(8, r.created_at).Bind(9, r.updated_at).Bind(10, r.completed_at);
  q.Bind(11, r.initiator).Bind(12, r.target);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 13, r.progress, what + " progress"));
  q.Bind(14, r.node);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<NodeRecord> ReadNode(const Row& q) {
  NodeRecord r;
  r.name = q.Text(0);
  r.url = q.Text(1);
  r.role = q.Text(2);
  r.state = q.Text(3);
  r.epoch = q.Int(4);
  r.heartbeat_at = q.Text(5);
  r.started_at = q.Text(6);
  const std::string what = fmt::format("node {}", r.name);
  SBX_ASSIGN_OR_RETURN(r.capacity, rows_internal::ColumnJson(q, 7, what + " capacity"));
  SBX_ASSIGN_OR_RETURN(r.load, rows_internal::ColumnJson(q, 8, what + " load"));
  SBX_ASSIGN_OR_RETURN(r.labels, rows_internal::ColumnJson(q, 9, what + " labels"));
  r.reason = q.Text(10);
  r.restart_by = q.Text(11);
  return r;
}

template <typename Params>
absl::Status BindNode(Params& q, const NodeRecord& r) {
  const std::string what = fmt::format("put node {}", r.name);
  q.Bind(1, r.name).Bind(2, r.url).Bind(3, r.role).Bind(4, r.state).Bind(5, r.epoch);
  q.Bind(6, r.heartbeat_at).Bind(7, r.started_at);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 8, r.capacity, what + " capacity"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 9, r.load, what + " load"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 10, r.labels, what + " labels"));
  q.Bind(11, r.reason);
  q.Bind(12, r.restart_by);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<ImageRecord> ReadImage(const Row& q) {
  ImageRecord r;
  r.digest = q.Text(0);
  r.name = q.Text(1);
  const std::string what = fmt::format("image {}", r.digest);
  SBX_ASSIGN_OR_RETURN(r.layers, rows_internal::ColumnJson(q, 2, what + " layers"));
  SBX_ASSIGN_OR_RETURN(r.config, rows_internal::ColumnJson(q, 3, what + " config"));
  SBX_ASSIGN_OR_RETURN(r.source, rows_internal::ColumnJson(q, 4, what + " source"));
  r.size = q.Int(5);
  r.created_at = q.Text(6);
  return r;
}

template <typename Params>
absl::Status BindImage(Params& q, const ImageRecord& r) {
  const std::string what = fmt::format("put image {}", r.digest);
  q.Bind(1, r.digest).Bind(2, r.name);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 3, r.layers, what + " layers"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 4, r.config, what + " config"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 5, r.source, what + " source"));
  q.Bind(6, r.size).Bind(7, r.created_at);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<TagRecord> ReadTag(const Row& q) {
  TagRecord r;
  r.name = q.Text(0);
  r.tag = q.Text(1);
  r.digest = q.Text(2);
  r.updated_at = q.Text(3);
  return r;
}

template <typename Params>
absl::Status BindTag(Params& q, const TagRecord& r) {
  q.Bind(1, r.name).Bind(2, r.tag).Bind(3, r.digest).Bind(4, r.updated_at);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<SessionRecord> ReadSession(const Row& q) {
  SessionRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.sandbox_id = q.Text(2);
  r.state = q.Text(3);
  SBX_ASSIGN_OR_RETURN(r.spec, rows_internal::ColumnJson(q, 4, fmt::format("session {} spec", r.id)));
  if (auto code = q.OptInt(5)) r.exit_code = static_cast<int>(*code);
  r.signal = q.OptText(6);
  r.timed_out = q.Int(7) != 0;
  r.oom_killed = q.Int(8) != 0;
  r.created_at = q.Text(9);
  r.started_at = q.OptText(10);
  r.exited_at = q.OptText(11);
  SBX_ASSIGN_OR_RETURN(r.error, rows_internal::ColumnJson(q, 12, fmt::format("session {} error", r.id)));
  return r;
}

template <typename Params>
absl::Status BindSession(Params& q, const SessionRecord& r) {
  q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.sandbox_id).Bind(4, r.state);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 5, r.spec, fmt::format("put session {} spec", r.id)));
  q.Bind(6, r.exit_code).Bind(7, r.signal).Bind(8, r.timed_out).Bind(9, r.oom_killed);
  q.Bind(10, r.created_at).Bind(11, r.started_at).Bind(12, r.exited_at);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 13, r.error, fmt::format("put session {} error", r.id)));
  return absl::OkStatus();
}

template <typename Row>
IdempotencyRecord ReadIdempotency(const Row& q) {
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

template <typename Params>
absl::Status BindIdempotency(Params& q, const IdempotencyRecord& r) {
  q.Bind(1, r.tenant_id).Bind(2, r.key).Bind(3, r.method).Bind(4, r.route);
  q.Bind(5, r.body_hash).Bind(6, r.status).Bind(7, r.response_body).Bind(8, r.created_at);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<TenantRecord> ReadTenant(const Row& q) {
  TenantRecord r;
  r.id = q.Text(0);
  r.name = q.Text(1);
  r.state = q.Text(2);
  const std::string what = fmt::format("tenant {}", r.id);
  SBX_ASSIGN_OR_RETURN(r.quotas, rows_internal::ColumnJson(q, 3, what + " quotas"));
  SBX_ASSIGN_OR_RETURN(r.rate_limit, rows_internal::ColumnJson(q, 4, what + " rate_limit"));
  r.created_at = q.Text(5);
  r.updated_at = q.Text(6);
  SBX_ASSIGN_OR_RETURN(r.egress_profiles, rows_internal::ColumnJson(q, 7, what + " egress_profiles"));
  return r;
}

template <typename Params>
absl::Status BindTenant(Params& q, const TenantRecord& r) {
  const std::string what = fmt::format("put tenant {}", r.id);
  q.Bind(1, r.id).Bind(2, r.name).Bind(3, r.state);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 4, r.quotas, what + " quotas"));
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 5, r.rate_limit, what + " rate_limit"));
  q.Bind(6, r.created_at).Bind(7, r.updated_at);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 8, r.egress_profiles, what + " egress_profiles"));
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<TokenRecord> ReadToken(const Row& q) {
  TokenRecord r;
  r.id = q.Text(0);
  r.tenant_id = q.Text(1);
  r.name = q.Text(2);
  r.hash = q.Text(3);
  SBX_ASSIGN_OR_RETURN(r.scopes, rows_internal::ColumnJson(q, 4, fmt::format("token {} scopes", r.id)));
  r.expires_at = q.OptText(5);
  r.created_at = q.Text(6);
  r.revoked_at = q.OptText(7);
  return r;
}

template <typename Params>
absl::Status BindToken(Params& q, const TokenRecord& r) {
  q.Bind(1, r.id).Bind(2, r.tenant_id).Bind(3, r.name).Bind(4, r.hash);
  SBX_RETURN_IF_ERROR(rows_internal::BindJson(q, 5, r.scopes, fmt::format("put token {} scopes", r.id)));
  q.Bind(6, r.expires_at).Bind(7, r.created_at).Bind(8, r.revoked_at);
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<AuditRecord> ReadAudit(const Row& q) {
  AuditRecord r;
  r.seq = q.Int(0);
  r.time = q.Text(1);
  r.tenant_id = q.Text(2);
  r.token_id = q.Text(3);
  r.action = q.Text(4);
  r.target = q.Text(5);
  r.status = static_cast<int>(q.Int(6));
  r.code = q.Text(7);
  r.request_id = q.Text(8);
  return r;
}

template <typename Params>
absl::Status BindAudit(Params& q, const AuditRecord& r) {
  q.BindNull(1).Bind(2, r.time).Bind(3, r.tenant_id).Bind(4, r.token_id).Bind(5, r.action);
  q.Bind(6, r.target).Bind(7, r.status).Bind(8, r.code).Bind(9, r.request_id);
  return absl::OkStatus();
}


// The page token is base64url(JSON ["<created_at>", "<id>"]) of the last row returned: the
// next page starts strictly after that position, so rows inserted meanwhile neither shift nor
// repeat. Decoding returns nullopt for anything else (the token comes from the client).
std::string EncodePageToken(const SandboxRecord& last);
std::optional<std::pair<std::string, std::string>> DecodePageToken(const std::string& token);

}  // namespace sbx::store
