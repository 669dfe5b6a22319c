// The Store over SQLite (docs/store.md), the single host's default: one file, its
// transactions serialized in the process.
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
#include "store/query_timers.h"
#include "store/rows.h"
#include "store/statements.h"
#include "store/sqlite_schema.h"

namespace sbx::store {
namespace {

constexpr int kMaxPageSize = 500;
constexpr int kMaxAuditPage = 1000;

// Statements are cached by the address of these constants, so each must be a named array.
constexpr char kBegin[] = "BEGIN IMMEDIATE";
constexpr char kCommit[] = "COMMIT";
constexpr char kRollback[] = "ROLLBACK";
// Tx::EndSession in two statements that never touch the session's spec or error (JSON that the
// default's read and rewrite of the whole row decoded and encoded again on every exit). Inside
// BEGIN IMMEDIATE nothing can change the row between them.
constexpr char kSessionState[] = "SELECT state FROM sessions WHERE id = ?1";
constexpr char kEndSession[] =
    "UPDATE sessions SET state = 'exited', started_at = COALESCE(started_at, ?2),"
    " exited_at = ?2, exit_code = ?3, signal = ?4, timed_out = ?5, oom_killed = ?6"
    " WHERE id = ?1";

using namespace sql;  // NOLINT: the shared statements are this file's vocabulary

class SqliteStore final : public Store {
 public:
  SqliteStore(SqliteDb db, std::string path, metrics::Registry& registry)
      : db_(std::move(db)), path_(std::move(path)), timers_(registry) {}

  metrics::Histogram& Timer(QueryOp op) { return timers_[op]; }

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
  QueryTimers timers_;
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
    return GetById<SandboxRecord>(kGetSandbox, "get sandbox", "sandbox", id, ReadSandbox<StmtCursor>);
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

  absl::StatusOr<std::vector<SandboxRecord>> ListLiveSandboxes(const std::string& node) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListLiveSandboxes));
    return ListAll<SandboxRecord>(kListLiveSandboxes, "list live sandboxes", ReadSandbox<StmtCursor>,
                                  &node);
  }

  absl::StatusOr<int64_t> ClaimUnassigned(const std::string& node) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    SBX_RETURN_IF_ERROR(
        DeleteWhere(kClaimUnassignedOperations, "claim unassigned operations", node).status());
    return DeleteWhere(kClaimUnassignedSandboxes, "claim unassigned sandboxes", node);
  }

  absl::StatusOr<NodeRecord> GetNode(const std::string& name) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    return GetById<NodeRecord>(kGetNode, "get node", "node", name, ReadNode<StmtCursor>);
  }

  absl::Status PutNode(const NodeRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    return Put(kPutNode, "put node", r, BindNode<StmtCursor>);
  }

  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    return ListAll<NodeRecord>(kListNodes, "list nodes", ReadNode<StmtCursor>);
  }

  absl::StatusOr<std::map<std::string, int64_t>> CountHeldSandboxesByNode() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    constexpr std::string_view kStep = "count sandboxes by node";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kCountHeldByNode, kStep));
    StmtCursor q(stmt);
    std::map<std::string, int64_t> out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) out[q.Text(0)] = q.Int(1);
    if (rc != SQLITE_DONE) return Error(rc, kStep);
    return out;
  }

  absl::StatusOr<std::map<std::string, int64_t>> CountLabelledSandboxesByNode(
      const std::string& tenant_id, const std::string& key, const std::string& value) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    constexpr std::string_view kStep = "count labelled sandboxes by node";
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kCountLabelledByNode, kStep));
    StmtCursor q(stmt);
    q.Bind(1, tenant_id);
    q.Bind(2, key);
    q.Bind(3, value);
    std::map<std::string, int64_t> out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) out[q.Text(0)] = q.Int(1);
    if (rc != SQLITE_DONE) return Error(rc, kStep);
    return out;
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
    return Put(kPutSandbox, "put sandbox", r, BindSandbox<StmtCursor>);
  }

  absl::StatusOr<OperationRecord> GetOperation(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetOperation));
    return GetById<OperationRecord>(kGetOperation, "get operation", "operation", id,
                                    ReadOperation<StmtCursor>);
  }

  absl::Status PutOperation(const OperationRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutOperation));
    return Put(kPutOperation, "put operation", r, BindOperation<StmtCursor>);
  }

  absl::StatusOr<std::vector<OperationRecord>> ListUnfinishedOperations(
      const std::string& node) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListUnfinishedOperations));
    return ListAll<OperationRecord>(kListUnfinishedOperations, "list unfinished operations",
                                    ReadOperation<StmtCursor>, &node);
  }

  absl::StatusOr<std::vector<OperationRecord>> ListOperations(
      const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListOperations));
    return ListAll<OperationRecord>(kListOperations, "list operations", ReadOperation<StmtCursor>,
                                    &sandbox_id);
  }

  // Templates are rare writes and small reads: one timer for all their statements.
  absl::StatusOr<ImageRecord> GetImage(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return GetById<ImageRecord>(kGetImage, "get image", "template image", digest, ReadImage<StmtCursor>);
  }

  absl::Status PutImage(const ImageRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Put(kPutImage, "put image", r, BindImage<StmtCursor>);
  }

  absl::Status DeleteImage(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return DeleteByKey(kDeleteImage, "delete image", digest, nullptr);
  }

  absl::StatusOr<std::vector<ImageRecord>> ListImages() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return ListAll<ImageRecord>(kListImages, "list images", ReadImage<StmtCursor>);
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
    return Put(kPutTag, "put template tag", r, BindTag<StmtCursor>);
  }

  absl::Status DeleteTag(const std::string& name, const std::string& tag) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return DeleteByKey(kDeleteTag, "delete template tag", name, &tag);
  }

  absl::StatusOr<std::vector<TagRecord>> ListTags() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return ListAll<TagRecord>(kListTags, "list template tags", ReadTag<StmtCursor>);
  }

  absl::StatusOr<int64_t> CountLiveSandboxesWithDigest(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return CountOne(kCountLiveWithDigest, "count sandboxes of a template digest", digest);
  }

  absl::StatusOr<SessionRecord> GetSession(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSession));
    return GetById<SessionRecord>(kGetSession, "get session", "session", id, ReadSession<StmtCursor>);
  }

  absl::Status PutSession(const SessionRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSession));
    return Put(kPutSession, "put session", r, BindSession<StmtCursor>);
  }

  // Timed as the default's read and write, so the query metrics count what happened: a
  // session that had ended already costs a read and no write.
  absl::StatusOr<std::string> EndSession(const std::string& id, const SessionEnd& end) override {
    constexpr std::string_view kStep = "end session";
    std::string was;
    {
      metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSession));
      SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kSessionState, kStep));
      StmtCursor q(stmt);
      q.Bind(1, id);
      const int rc = q.Step();
      if (rc == SQLITE_DONE) return absl::NotFoundError(fmt::format("session {} not found", id));
      if (rc != SQLITE_ROW) return Error(rc, kStep);
      was = q.Text(0);
    }
    if (was == "exited") return std::string();
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSession));
    SBX_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, store_.Prepare(kEndSession, kStep));
    StmtCursor q(stmt);
    q.Bind(1, id).Bind(2, end.at).Bind(3, end.exit_code).Bind(4, end.signal);
    q.Bind(5, end.timed_out).Bind(6, end.oom_killed);
    SBX_RETURN_IF_ERROR(Done(q, kStep));
    return was;
  }

  absl::StatusOr<std::vector<SessionRecord>> ListSessions(const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListSessions));
    return ListAll<SessionRecord>(kListSessions, "list sessions", ReadSession<StmtCursor>, &sandbox_id);
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
    return Put(kPutIdempotency, "put idempotency key", r, BindIdempotency<StmtCursor>);
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
    return GetById<TenantRecord>(kGetTenant, "get tenant", "tenant", id, ReadTenant<StmtCursor>);
  }

  absl::Status PutTenant(const TenantRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return Put(kPutTenant, "put tenant", r, BindTenant<StmtCursor>);
  }

  absl::StatusOr<std::vector<TenantRecord>> ListTenants() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return ListAll<TenantRecord>(kListTenants, "list tenants", ReadTenant<StmtCursor>);
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
    return GetById<TokenRecord>(kGetToken, "get token", "token", id, ReadToken<StmtCursor>);
  }

  absl::Status PutToken(const TokenRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return Put(kPutToken, "put token", r, BindToken<StmtCursor>);
  }

  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const std::string& tenant_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return ListAll<TokenRecord>(kListTokens, "list tokens", ReadToken<StmtCursor>, &tenant_id);
  }

  absl::StatusOr<int64_t> AppendAudit(const AuditRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kAppendAudit));
    SBX_RETURN_IF_ERROR(Put(kAppendAudit, "append audit line", r, BindAudit<StmtCursor>));
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

  // Runs a DELETE (or UPDATE) whose ?1 is `param` (a time bound, a key); returns how many rows
  // it removed (changed).
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
