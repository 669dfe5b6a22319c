// The Store over PostgreSQL (docs/store.md): the shared statements and row mappers, its own
// dialect where the databases differ, a pool of connections, and serialization failures run
// again. How statements travel to the server is pg_batch.h's.
#include "store/pg_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "absl/strings/escaping.h"
#include "common/status_util.h"
#include "store/pg_batch.h"
#include "store/pg_schema.h"
#include "store/query_timers.h"
#include "store/rows.h"
#include "store/statements.h"

namespace sbx::store {
namespace {

using namespace sql;  // NOLINT: the shared statements are this file's vocabulary

constexpr int kMaxPageSize = 500;
constexpr int kMaxAuditPage = 1000;

// Where PostgreSQL's dialect differs from SQLite's, its own text; everything else is
// statements.h with ?N read as $N. Parameters are sent as text, so each one whose type the
// statement does not fix by a column comparison is cast.
#define SBX_PG_LIST_SANDBOXES_WHERE                                                        \
  " FROM sandboxes"                                                                        \
  " WHERE tenant_id = $1"                                                                  \
  " AND ($2::text IS NULL OR state = $2::text)"                                            \
  " AND ($3::boolean OR state <> 'deleted')"                                               \
  " AND ($4::text IS NULL OR (jsonb_typeof(labels::jsonb -> $4::text) = 'string'"          \
  "      AND labels::jsonb ->> $4::text = $5::text))"
constexpr char kPgListSandboxesFirst[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                         SBX_PG_LIST_SANDBOXES_WHERE
                                         " ORDER BY created_at, id LIMIT $6::bigint";
constexpr char kPgListSandboxesAfter[] = "SELECT " SBX_STORE_SANDBOX_COLS
                                         SBX_PG_LIST_SANDBOXES_WHERE
                                         " AND (created_at, id) > ($7::text, $8::text)"
                                         " ORDER BY created_at, id LIMIT $6::bigint";
#undef SBX_PG_LIST_SANDBOXES_WHERE
constexpr char kPgCountLabelledByNode[] =
    "SELECT node, COUNT(*) FROM sandboxes WHERE tenant_id = $1::text"
    " AND state NOT IN ('deleted', 'failed', 'lost')"
    " AND jsonb_typeof(labels::jsonb -> $2::text) = 'string'"
    " AND labels::jsonb ->> $2::text = $3::text"
    " GROUP BY node";
// $1 since, $2 after_seq, $3 limit (SQLite's statement has no tenant parameter to skip).
constexpr char kPgListAuditAll[] = "SELECT " SBX_STORE_AUDIT_COLS
                                   " FROM audit_log WHERE seq > $2::bigint AND time >= $1::text"
                                   " ORDER BY seq LIMIT $3::bigint";
// The seq comes from the counter row (pg_schema.cc); $1..$8 are BindAudit's 2..9.
constexpr char kPgAppendAudit[] =
    "WITH n AS (UPDATE audit_seq SET last = last + 1 WHERE id = 1 RETURNING last)"
    " INSERT INTO audit_log (" SBX_STORE_AUDIT_COLS
    ") SELECT n.last, $1::text, $2::text, $3::text, $4::text, $5::text, $6::bigint, $7::text,"
    " $8::text FROM n RETURNING seq";
// response_body is BYTEA (a body may hold NUL, which TEXT refuses); it travels as hex text.
constexpr char kPgGetIdempotency[] =
    "SELECT tenant_id, key, method, route, body_hash, status, encode(response_body, 'hex'),"
    " created_at FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 AND method = $3"
    " AND route = $4";
constexpr char kPgPutIdempotency[] =
    "INSERT INTO idempotency_keys (" SBX_STORE_IDEMPOTENCY_COLS
    ") VALUES ($1, $2, $3, $4, $5, $6, decode($7, 'hex'), $8)"
    " ON CONFLICT (tenant_id, key, method, route) DO UPDATE SET"
    " body_hash = excluded.body_hash, status = excluded.status,"
    " response_body = excluded.response_body, created_at = excluded.created_at";
constexpr int kResponseBodyParam = 7;  // in kPgPutIdempotency

constexpr char kPgGetTenantUsage[] = R"sql(SELECT COUNT(*),
  COALESCE(SUM(CASE WHEN state = 'suspended' THEN 0
               ELSE COALESCE((effective_resources::jsonb ->> 'vcpu')::numeric, 0) END), 0)::bigint,
  COALESCE(SUM(CASE WHEN state = 'suspended' THEN 0
               ELSE COALESCE((effective_resources::jsonb ->> 'memory_mib')::numeric, 0) END),
           0)::bigint,
  COALESCE(SUM(COALESCE((effective_resources::jsonb ->> 'disk_mib')::numeric, 0)), 0)::bigint
FROM sandboxes WHERE tenant_id = $1 AND state NOT IN ('deleted', 'failed') AND state <> 'lost')sql";

constexpr int CountColumns(std::string_view cols) {
  int n = 1;
  for (char c : cols) n += c == ',' ? 1 : 0;
  return n;
}
constexpr int kSandboxColumns = CountColumns(SBX_STORE_SANDBOX_COLS);

// The sandbox's columns, then its tenant's (all NULL when the tenant has no row).
constexpr char kPgGetSandboxAndTenant[] =
    "SELECT s.*, t.* FROM (SELECT " SBX_STORE_SANDBOX_COLS " FROM sandboxes WHERE id = $1) s"
    " LEFT JOIN (SELECT " SBX_STORE_TENANT_COLS " FROM tenants) t ON t.id = s.tenant_id";
// Also a transaction of its own (Store::EndSession, at any isolation level): `old` locks the
// row and reads its newest state, which the UPDATE (reading `old`, so after it) then changes
// unless the session had ended already. Answers the state before and whether it changed.
// $2 is SessionEnd::at.
constexpr char kPgEndSession[] =
    "WITH old AS (SELECT id, state FROM sessions WHERE id = $1 FOR UPDATE),"
    " upd AS (UPDATE sessions s SET state = 'exited',"
    " started_at = COALESCE(s.started_at, $2::text), exited_at = $2::text,"
    " exit_code = $3::bigint, signal = $4::text, timed_out = $5::bigint,"
    " oom_killed = $6::bigint"
    " FROM old WHERE s.id = old.id AND old.state <> 'exited' RETURNING s.id)"
    " SELECT old.state, (SELECT COUNT(*) FROM upd) FROM old";

// The reader side of rows.h over one result row; from column `first` on, for a row that
// holds two records side by side (a join).
class PgRow {
 public:
  explicit PgRow(const pqxx::row& row, int first = 0) : row_(row), first_(first) {}
  bool IsNull(int col) const { return row_[first_ + col].is_null(); }
  std::string Text(int col) const {
    const pqxx::field f = row_[first_ + col];
    return f.is_null() ? std::string() : std::string(f.c_str(), f.size());
  }
  std::optional<std::string> OptText(int col) const {
    if (IsNull(col)) return std::nullopt;
    return Text(col);
  }
  int64_t Int(int col) const { return IsNull(col) ? 0 : row_[first_ + col].as<int64_t>(); }
  std::optional<int64_t> OptInt(int col) const {
    if (IsNull(col)) return std::nullopt;
    return Int(col);
  }

 private:
  const pqxx::row& row_;
  const int first_;
};

std::string WithConnectTimeout(const std::string& url) {
  if (url.find("connect_timeout=") != std::string::npos) return url;
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "connect_timeout=10";
}

thread_local bool t_in_transaction = false;

class PgStore final : public Store {
 public:
  PgStore(std::string url, PgStoreOptions options, metrics::Registry& registry)
      : url_(std::move(url)),
        where_(RedactStoreUrl(url_)),
        options_(options),
        timers_(registry),
        retries_(registry
                     .AddCounter("sbx_store_transaction_retries_total",
                                 "Store transactions run again after PostgreSQL reported a "
                                 "serialization failure or a deadlock.",
                                 {})
                     .WithLabels({})) {}

  absl::Status Init() {
    SBX_ASSIGN_OR_RETURN(std::unique_ptr<PgConn> conn, Connect());
    try {
      SBX_RETURN_IF_ERROR(PreparePgSchema(conn->conn, where_));
    } catch (const pqxx::pqxx_exception& e) {
      return PgError(e, fmt::format("open {}: prepare schema", where_));
    }
    Release(std::move(conn));
    return absl::OkStatus();
  }

  absl::Status Transact(const std::function<absl::Status(Tx&)>& fn) override {
    return Run(fn, /*autocommit=*/false);
  }
  absl::Status Read(const std::function<absl::Status(Tx&)>& fn) override {
    return Run(fn, /*autocommit=*/true);
  }
  absl::StatusOr<std::string> EndSession(const std::string& id, const SessionEnd& end) override {
    std::string was;
    SBX_RETURN_IF_ERROR(Run(
        [&](Tx& tx) -> absl::Status {
          SBX_ASSIGN_OR_RETURN(was, tx.EndSession(id, end));
          return absl::OkStatus();
        },
        /*autocommit=*/true));
    return was;
  }

  metrics::Histogram& Timer(QueryOp op) { return timers_[op]; }

 private:
  absl::StatusOr<std::unique_ptr<PgConn>> Connect() {
    try {
      return std::make_unique<PgConn>(WithConnectTimeout(url_));
    } catch (const pqxx::pqxx_exception& e) {
      return PgError(e, fmt::format("open {}: connect", where_));
    }
  }

  // A pooled connection, or a new one while fewer than pool_size exist; waits otherwise.
  // A pooled connection whose server went away while it sat idle (the server restarted, an
  // administrator's pg_terminate_backend) is replaced here, before a transaction fails on it.
  absl::StatusOr<std::unique_ptr<PgConn>> Acquire() {
    while (true) {
      std::unique_ptr<PgConn> conn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !idle_.empty() || open_ < options_.pool_size; });
        if (idle_.empty()) {
          ++open_;
          break;
        }
        conn = std::move(idle_.back());
        idle_.pop_back();
      }
      if (conn->IdleAndOpen()) return conn;
      conn.reset();  // closes it
      Discard();
    }
    auto conn = Connect();
    if (!conn.ok()) Discard();
    return conn;
  }

  void Release(std::unique_ptr<PgConn> conn) {
    {
      std::lock_guard lock(mu_);
      idle_.push_back(std::move(conn));
    }
    cv_.notify_one();
  }

  // Forgets a connection that broke: the next Acquire opens a new one.
  void Discard() {
    {
      std::lock_guard lock(mu_);
      --open_;
    }
    cv_.notify_one();
  }

  // One attempt of fn in one transaction on `conn`. Sets *retry when PostgreSQL asks for one.
  absl::Status Attempt(PgConn& conn, const std::function<absl::Status(Tx&)>& fn, bool autocommit,
                       bool* retry, bool* broken);
  absl::Status Run(const std::function<absl::Status(Tx&)>& fn, bool autocommit);

  const std::string url_;
  const std::string where_;
  const PgStoreOptions options_;
  QueryTimers timers_;
  metrics::Counter& retries_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<PgConn>> idle_;
  int open_ = 0;  // connections in idle_ or in use
};

// Round trips are what a transaction costs here (each one wakes the server's process and
// ours), so a PgTx sends as few as it can. Every statement travels as text in one simple query
// with what the transaction still owes the server: its BEGIN (sent with the first statement,
// none at all for a transaction that runs none), the PREPARE of a statement new to the
// connection, and the writes queued since the last read. Upserts whose result no caller reads
// (Queue) wait for the next read or ride with the COMMIT, so "read, read, write, write, commit"
// costs three round trips, not seven. A queued write that fails fails the transaction at that
// read or at the commit, with its step named, as it would have a statement later.
class PgTx final : public Tx {
 public:
  // `autocommit`: Store::Read's (pg_batch.h).
  PgTx(PgStore& store, PgConn& conn, pqxx::nontransaction& tx, bool autocommit)
      : store_(store),
        batch_(conn, tx, autocommit, store.Timer(QueryOp::kBegin), store.Timer(QueryOp::kCommit)) {}

  PgBatch& batch() { return batch_; }

  absl::StatusOr<SandboxRecord> GetSandbox(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSandbox));
    return GetOne<SandboxRecord>(kGetSandbox, "get sandbox", Key(id), ReadSandbox<PgRow>,
                                 [&] { return fmt::format("sandbox {} not found", id); });
  }

  absl::StatusOr<SandboxAndTenant> GetSandboxAndTenant(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSandbox));
    SBX_ASSIGN_OR_RETURN(pqxx::result res,
                         Exec(kPgGetSandboxAndTenant, "get sandbox and tenant", Key(id)));
    if (res.empty()) return absl::NotFoundError(fmt::format("sandbox {} not found", id));
    SandboxAndTenant out;
    SBX_ASSIGN_OR_RETURN(out.sandbox, ReadSandbox<PgRow>(PgRow(res[0])));
    const PgRow tenant(res[0], kSandboxColumns);
    if (!tenant.IsNull(0)) {
      SBX_ASSIGN_OR_RETURN(TenantRecord t, ReadTenant<PgRow>(tenant));
      out.tenant = std::move(t);
    }
    return out;
  }

  absl::StatusOr<Page<SandboxRecord>> ListSandboxes(const SandboxFilter& filter) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListSandboxes));
    std::optional<std::pair<std::string, std::string>> after;
    if (!filter.page_token.empty()) {
      after = DecodePageToken(filter.page_token);
      if (!after) return absl::InvalidArgumentError("page_token is invalid");
    }
    const int limit = std::clamp(filter.limit, 1, kMaxPageSize);
    PgParams p;
    p.Bind(1, filter.tenant_id).Bind(2, filter.state).Bind(3, filter.include_deleted);
    p.BindNull(4).BindNull(5);
    if (filter.label) p.Bind(4, filter.label->first).Bind(5, filter.label->second);
    // One extra row tells whether another page exists without a COUNT query.
    p.Bind(6, int64_t{limit} + 1);
    if (after) p.Bind(7, after->first).Bind(8, after->second);
    SBX_ASSIGN_OR_RETURN(std::vector<SandboxRecord> rows,
                         List<SandboxRecord>(after ? kPgListSandboxesAfter : kPgListSandboxesFirst,
                                             "list sandboxes", p, ReadSandbox<PgRow>));
    Page<SandboxRecord> page;
    if (static_cast<int>(rows.size()) > limit) {
      rows.resize(static_cast<size_t>(limit));
      page.next_page_token = EncodePageToken(rows.back());
    }
    page.items = std::move(rows);
    return page;
  }

  absl::StatusOr<std::vector<SandboxRecord>> ListLiveSandboxes(const std::string& node) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListLiveSandboxes));
    return List<SandboxRecord>(kListLiveSandboxes, "list live sandboxes", Key(node),
                               ReadSandbox<PgRow>);
  }

  absl::StatusOr<int64_t> ClaimUnassigned(const std::string& node) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    SBX_RETURN_IF_ERROR(
        Exec(kClaimUnassignedOperations, "claim unassigned operations", Key(node)).status());
    SBX_ASSIGN_OR_RETURN(pqxx::result res,
                         Exec(kClaimUnassignedSandboxes, "claim unassigned sandboxes", Key(node)));
    return static_cast<int64_t>(res.affected_rows());
  }

  absl::StatusOr<NodeRecord> GetNode(const std::string& name) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    return GetOne<NodeRecord>(kGetNode, "get node", Key(name), ReadNode<PgRow>,
                              [&] { return fmt::format("node {} not found", name); });
  }

  absl::Status PutNode(const NodeRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    return QueuePut(kPutNode, "put node", r, BindNode<PgParams>);
  }

  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    return List<NodeRecord>(kListNodes, "list nodes", {}, ReadNode<PgRow>);
  }

  absl::StatusOr<std::map<std::string, int64_t>> CountHeldSandboxesByNode() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    SBX_ASSIGN_OR_RETURN(pqxx::result res,
                         Exec(kCountHeldByNode, "count sandboxes by node", {}));
    std::map<std::string, int64_t> out;
    for (const pqxx::row& row : res) out[PgRow(row).Text(0)] = PgRow(row).Int(1);
    return out;
  }

  absl::StatusOr<std::map<std::string, int64_t>> CountLabelledSandboxesByNode(
      const std::string& tenant_id, const std::string& key, const std::string& value) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kNodes));
    PgParams p;
    p.Bind(1, tenant_id).Bind(2, key).Bind(3, value);
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(kPgCountLabelledByNode,
                                                "count labelled sandboxes by node", p));
    std::map<std::string, int64_t> out;
    for (const pqxx::row& row : res) out[PgRow(row).Text(0)] = PgRow(row).Int(1);
    return out;
  }

  absl::StatusOr<std::map<std::string, int64_t>> CountLiveSandboxesByState() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kCountLiveSandboxesByState));
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(kCountLiveSandboxesByState,
                                                "count live sandboxes by state", {}));
    std::map<std::string, int64_t> out;
    for (const pqxx::row& row : res) out[PgRow(row).Text(0)] = PgRow(row).Int(1);
    return out;
  }

  absl::Status PutSandbox(const SandboxRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSandbox));
    return QueuePut(kPutSandbox, "put sandbox", r, BindSandbox<PgParams>);
  }

  absl::StatusOr<OperationRecord> GetOperation(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetOperation));
    return GetOne<OperationRecord>(kGetOperation, "get operation", Key(id),
                                   ReadOperation<PgRow>,
                                   [&] { return fmt::format("operation {} not found", id); });
  }

  absl::Status PutOperation(const OperationRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutOperation));
    return QueuePut(kPutOperation, "put operation", r, BindOperation<PgParams>);
  }

  absl::StatusOr<std::vector<OperationRecord>> ListOperations(
      const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListOperations));
    return List<OperationRecord>(kListOperations, "list operations", Key(sandbox_id),
                                 ReadOperation<PgRow>);
  }

  absl::StatusOr<std::vector<OperationRecord>> ListUnfinishedOperations(
      const std::string& node) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListUnfinishedOperations));
    return List<OperationRecord>(kListUnfinishedOperations, "list unfinished operations",
                                 Key(node), ReadOperation<PgRow>);
  }

  absl::StatusOr<SessionRecord> GetSession(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetSession));
    return GetOne<SessionRecord>(kGetSession, "get session", Key(id), ReadSession<PgRow>,
                                 [&] { return fmt::format("session {} not found", id); });
  }

  absl::Status PutSession(const SessionRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSession));
    return QueuePut(kPutSession, "put session", r, BindSession<PgParams>);
  }

  absl::StatusOr<std::string> EndSession(const std::string& id, const SessionEnd& end) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutSession));
    PgParams p;
    p.Bind(1, id).Bind(2, end.at).Bind(3, end.exit_code).Bind(4, end.signal);
    p.Bind(5, end.timed_out).Bind(6, end.oom_killed);
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(kPgEndSession, "end session", p));
    if (res.empty()) return absl::NotFoundError(fmt::format("session {} not found", id));
    const PgRow row(res[0]);
    return row.Int(1) > 0 ? row.Text(0) : std::string();
  }

  absl::StatusOr<std::vector<SessionRecord>> ListSessions(const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListSessions));
    return List<SessionRecord>(kListSessions, "list sessions", Key(sandbox_id),
                               ReadSession<PgRow>);
  }

  absl::StatusOr<std::optional<IdempotencyRecord>> GetIdempotency(
      const std::string& tenant_id, const std::string& key, const std::string& method,
      const std::string& route) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetIdempotency));
    PgParams p;
    p.Bind(1, tenant_id).Bind(2, key).Bind(3, method).Bind(4, route);
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(kPgGetIdempotency, "get idempotency key", p));
    if (res.empty()) return std::optional<IdempotencyRecord>();
    IdempotencyRecord r = ReadIdempotency(PgRow(res[0]));
    r.response_body = absl::HexStringToBytes(r.response_body);
    return std::optional<IdempotencyRecord>(std::move(r));
  }

  absl::Status PutIdempotency(const IdempotencyRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPutIdempotency));
    PgParams p;
    SBX_RETURN_IF_ERROR(BindIdempotency(p, r));
    p.Bind(kResponseBodyParam, absl::BytesToHexString(r.response_body));
    return Queue(kPgPutIdempotency, "put idempotency key", p);
  }

  absl::StatusOr<ImageRecord> GetImage(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return GetOne<ImageRecord>(kGetImage, "get image", Key(digest), ReadImage<PgRow>, [&] {
      return fmt::format("template image {} not found", digest);
    });
  }

  absl::Status PutImage(const ImageRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Put(kPutImage, "put image", r, BindImage<PgParams>);
  }

  absl::Status DeleteImage(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Exec(kDeleteImage, "delete image", Key(digest)).status();
  }

  absl::StatusOr<std::vector<ImageRecord>> ListImages() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return List<ImageRecord>(kListImages, "list images", {}, ReadImage<PgRow>);
  }

  absl::StatusOr<TagRecord> GetTag(const std::string& name, const std::string& tag) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    PgParams p;
    p.Bind(1, name).Bind(2, tag);
    return GetOne<TagRecord>(kGetTag, "get template tag", p, ReadTag<PgRow>, [&] {
      return fmt::format("template {}:{} not found", name, tag);
    });
  }

  absl::Status PutTag(const TagRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Put(kPutTag, "put template tag", r, BindTag<PgParams>);
  }

  absl::Status DeleteTag(const std::string& name, const std::string& tag) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    PgParams p;
    p.Bind(1, name).Bind(2, tag);
    return Exec(kDeleteTag, "delete template tag", p).status();
  }

  absl::StatusOr<std::vector<TagRecord>> ListTags() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return List<TagRecord>(kListTags, "list template tags", {}, ReadTag<PgRow>);
  }

  absl::StatusOr<int64_t> CountLiveSandboxesWithDigest(const std::string& digest) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTemplates));
    return Count(kCountLiveWithDigest, "count sandboxes of a template digest", Key(digest));
  }

  absl::StatusOr<TenantRecord> GetTenant(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return GetOne<TenantRecord>(kGetTenant, "get tenant", Key(id), ReadTenant<PgRow>,
                                [&] { return fmt::format("tenant {} not found", id); });
  }

  absl::Status PutTenant(const TenantRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return Put(kPutTenant, "put tenant", r, BindTenant<PgParams>);
  }

  absl::StatusOr<std::vector<TenantRecord>> ListTenants() override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return List<TenantRecord>(kListTenants, "list tenants", {}, ReadTenant<PgRow>);
  }

  absl::Status DeleteTenant(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(kDeleteTenant, "delete tenant", Key(id)));
    if (res.affected_rows() == 0) return absl::NotFoundError(fmt::format("tenant {} not found", id));
    // The tokens' foreign key is deferred, so they may go after their tenant.
    return Exec(kDeleteTenantTokens, "delete tenant", Key(id)).status();
  }

  absl::StatusOr<TokenRecord> GetToken(const std::string& id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetToken));
    return GetOne<TokenRecord>(kGetToken, "get token", Key(id), ReadToken<PgRow>,
                               [&] { return fmt::format("token {} not found", id); });
  }

  absl::Status PutToken(const TokenRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return Put(kPutToken, "put token", r, BindToken<PgParams>);
  }

  absl::StatusOr<std::vector<TokenRecord>> ListTokens(const std::string& tenant_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kTenants));
    return List<TokenRecord>(kListTokens, "list tokens", Key(tenant_id), ReadToken<PgRow>);
  }

  absl::StatusOr<int64_t> AppendAudit(const AuditRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kAppendAudit));
    PgParams p;
    SBX_RETURN_IF_ERROR(BindAudit(p, r));
    p.DropFirst();  // the seq: the counter row assigns it
    return Count(kPgAppendAudit, "append audit line", p);
  }

  absl::Status AddAudit(const AuditRecord& r) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kAppendAudit));
    PgParams p;
    SBX_RETURN_IF_ERROR(BindAudit(p, r));
    p.DropFirst();
    return Queue(kPgAppendAudit, "append audit line", p);
  }

  absl::StatusOr<std::vector<AuditRecord>> ListAudit(const AuditFilter& filter) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kListAudit));
    const int64_t limit = std::clamp(filter.limit, 1, kMaxAuditPage);
    PgParams p;
    if (filter.tenant_id) {
      p.Bind(1, *filter.tenant_id).Bind(2, filter.since).Bind(3, filter.after_seq).Bind(4, limit);
      return List<AuditRecord>(kListAuditTenant, "list audit lines", p, ReadAudit<PgRow>);
    }
    p.Bind(1, filter.since).Bind(2, filter.after_seq).Bind(3, limit);
    return List<AuditRecord>(kPgListAuditAll, "list audit lines", p, ReadAudit<PgRow>);
  }

  absl::StatusOr<TenantUsage> GetTenantUsage(const std::string& tenant_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kGetTenantUsage));
    SBX_ASSIGN_OR_RETURN(pqxx::result res,
                         Exec(kPgGetTenantUsage, "get tenant usage", Key(tenant_id)));
    PgRow q(res[0]);
    return TenantUsage{q.Int(0), q.Int(1), q.Int(2), q.Int(3)};
  }

  absl::StatusOr<int64_t> CountLiveSessions(const std::string& sandbox_id) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kCountLiveSessions));
    return Count(kCountLiveSessions, "count live sessions", Key(sandbox_id));
  }

  absl::StatusOr<int64_t> PurgeIdempotency(const std::string& before) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPurgeIdempotency));
    SBX_ASSIGN_OR_RETURN(pqxx::result res,
                         Exec(kPurgeIdempotency, "purge idempotency keys", Key(before)));
    return static_cast<int64_t>(res.affected_rows());
  }

  absl::StatusOr<int64_t> PurgeDeletedSandboxes(const std::string& before) override {
    metrics::ScopedTimer timer(store_.Timer(QueryOp::kPurgeDeletedSandboxes));
    constexpr std::string_view kStep = "purge deleted sandboxes";
    for (const char* sql :
         {kPurgeDeletedSessions, kPurgeDeletedOperations, kPurgeTemplateOperations}) {
      SBX_RETURN_IF_ERROR(Exec(sql, kStep, Key(before)).status());
    }
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(kPurgeDeletedSandboxes, kStep, Key(before)));
    return static_cast<int64_t>(res.affected_rows());
  }

 private:
  static PgParams Key(const std::string& k) {
    PgParams p;
    p.Bind(1, k);
    return p;
  }

  absl::StatusOr<pqxx::result> Exec(const char* sql, std::string_view step, const PgParams& p) {
    return batch_.Exec(sql, step, p);
  }
  absl::Status Queue(const char* sql, std::string_view step, const PgParams& p) {
    return batch_.Queue(sql, step, p);
  }

  template <typename T, typename ReadFn, typename MissingFn>
  absl::StatusOr<T> GetOne(const char* sql, std::string_view step, const PgParams& p,
                           ReadFn read, MissingFn missing) {
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(sql, step, p));
    if (res.empty()) return absl::NotFoundError(missing());
    return read(PgRow(res[0]));
  }

  template <typename T, typename ReadFn>
  absl::StatusOr<std::vector<T>> List(const char* sql, std::string_view step, const PgParams& p,
                                      ReadFn read) {
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(sql, step, p));
    std::vector<T> out;
    out.reserve(res.size());
    for (const pqxx::row& row : res) {
      SBX_ASSIGN_OR_RETURN(T r, read(PgRow(row)));
      out.push_back(std::move(r));
    }
    return out;
  }

  template <typename T, typename BindFn>
  absl::Status Put(const char* sql, std::string_view step, const T& rec, BindFn bind) {
    PgParams p;
    SBX_RETURN_IF_ERROR(bind(p, rec));
    return Exec(sql, step, p).status();
  }

  // Put for the upserts no caller reads a result of (their conflicts change nothing and are no
  // error, store.h): queued.
  template <typename T, typename BindFn>
  absl::Status QueuePut(const char* sql, std::string_view step, const T& rec, BindFn bind) {
    PgParams p;
    SBX_RETURN_IF_ERROR(bind(p, rec));
    return Queue(sql, step, p);
  }

  // The first column of the one row a "SELECT COUNT(*)" (or "RETURNING n") gives.
  absl::StatusOr<int64_t> Count(const char* sql, std::string_view step, const PgParams& p) {
    SBX_ASSIGN_OR_RETURN(pqxx::result res, Exec(sql, step, p));
    if (res.empty()) return absl::InternalError(fmt::format("store: {}: no row", step));
    return PgRow(res[0]).Int(0);
  }

  PgStore& store_;
  PgBatch batch_;
};

absl::Status PgStore::Attempt(PgConn& conn, const std::function<absl::Status(Tx&)>& fn,
                              bool autocommit, bool* retry, bool* broken) {
  try {
    pqxx::nontransaction ntx(conn.conn);
    PgTx tx(*this, conn, ntx, autocommit);
    PgBatch& batch = tx.batch();
    absl::Status st = fn(tx);
    if (!batch.failure().ok()) {
      *retry = batch.retryable();
      batch.Rollback();
      if (st.ok()) {
        // fn went on after a failed statement and returned OK: the change is lost, say so.
        return absl::Status(batch.failure().code(),
                            fmt::format("{} (the transaction was rolled back)",
                                        std::string(batch.failure().message())));
      }
      return st;
    }
    if (!st.ok()) {
      batch.Rollback();
      return st;
    }
    st = batch.Commit();
    if (!st.ok()) {
      *retry = batch.retryable();
      batch.Rollback();  // a COMMIT that failed before it ran leaves the transaction open
    }
    return st;
  } catch (const pqxx::pqxx_exception& e) {
    *retry = IsRetryable(e);
    *broken = dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr;
    return PgError(e, "transaction");
  }
}

absl::Status PgStore::Run(const std::function<absl::Status(Tx&)>& fn, bool autocommit) {
  if (t_in_transaction) {
    return absl::FailedPreconditionError("store: Transact called from inside a transaction");
  }
  t_in_transaction = true;
  struct Exit {
    ~Exit() { t_in_transaction = false; }
  } exit;

  absl::Status st;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    SBX_ASSIGN_OR_RETURN(std::unique_ptr<PgConn> conn, Acquire());
    bool retry = false;
    bool broken = false;
    // An exception from fn itself (not libpqxx's) rolls back (the transaction's destructor)
    // and propagates, as with SQLite; the connection goes back to the pool in any case.
    struct Return {
      PgStore* s;
      std::unique_ptr<PgConn>* c;
      const bool* broken;
      ~Return() {
        if (*broken || (*c)->poisoned || !(*c)->conn.is_open()) {
          s->Discard();
        } else {
          s->Release(std::move(*c));
        }
      }
    } give_back{this, &conn, &broken};
    st = Attempt(*conn, fn, autocommit, &retry, &broken);
    if (st.ok() || !retry) return st;
    retries_.Inc();
    // Spread the competitors out: 1, 2, 4 ... 64 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(1 << std::min(attempt - 1, 6)));
  }
  return absl::AbortedError(fmt::format("store: transaction: {} attempts lost serialization races ({})",
                                        options_.max_attempts, std::string(st.message())));
}

}  // namespace

std::string RedactStoreUrl(const std::string& url) {
  std::string out = url;
  // user:password@ in the authority
  const size_t scheme = out.find("://");
  if (scheme != std::string::npos) {
    const size_t start = scheme + 3;
    const size_t at = out.find('@', start);
    const size_t slash = out.find('/', start);
    if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
      const size_t colon = out.find(':', start);
      if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  // password=... among the parameters
  for (size_t pos = out.find("password="); pos != std::string::npos;
       pos = out.find("password=", pos + 1)) {
    const size_t value = pos + 9;
    const size_t end = out.find('&', value);
    out.replace(value, (end == std::string::npos ? out.size() : end) - value, "***");
  }
  return out;
}

absl::StatusOr<StorePtr> OpenPgStore(const std::string& url, const PgStoreOptions& options,
                                     metrics::Registry& registry) {
  if (options.pool_size < 1 || options.max_attempts < 1) {
    return absl::InvalidArgumentError("store: pool_size and max_attempts must be at least 1");
  }
  auto store = std::make_unique<PgStore>(url, options, registry);
  SBX_RETURN_IF_ERROR(store->Init());
  return StorePtr(std::move(store));
}

}  // namespace sbx::store
