// How PgStore talks to PostgreSQL: a pooled connection, parameters as text, errors as Status,
// and PgBatch, one transaction's round trips (docs/store.md, "Round trips").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <pqxx/pqxx>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace sbx::store {

// SQLite's ?N placeholders as PostgreSQL's $N. The shared statements hold no '?' elsewhere.
std::string ToPgPlaceholders(std::string_view sql);

// The binder side of rows.h: parameters as text (NULL as nullopt), which PostgreSQL converts to
// each column's type.
class PgParams {
 public:
  PgParams& Bind(int idx, std::string_view v) {
    Slot(idx) = std::string(v);
    return *this;
  }
  PgParams& Bind(int idx, const std::string& v) { return Bind(idx, std::string_view(v)); }
  PgParams& Bind(int idx, const char* v) { return Bind(idx, std::string_view(v)); }
  PgParams& Bind(int idx, int64_t v) { return Bind(idx, std::to_string(v)); }
  PgParams& Bind(int idx, int v) { return Bind(idx, int64_t{v}); }
  PgParams& Bind(int idx, bool v) { return Bind(idx, v ? "1" : "0"); }
  PgParams& BindNull(int idx) {
    Slot(idx).reset();
    return *this;
  }
  template <typename T>
  PgParams& Bind(int idx, const std::optional<T>& v) {
    return v.has_value() ? Bind(idx, *v) : BindNull(idx);
  }

  // Drops parameter 1 and renumbers the rest (for kPgAppendAudit).
  void DropFirst() { values_.erase(values_.begin()); }
  const std::vector<std::optional<std::string>>& values() const { return values_; }

 private:
  std::optional<std::string>& Slot(int idx) {
    if (values_.size() < static_cast<size_t>(idx)) values_.resize(static_cast<size_t>(idx));
    return values_[static_cast<size_t>(idx) - 1];
  }
  std::vector<std::optional<std::string>> values_;
};

// One pooled connection and the statements prepared on it (named by the SQL's address).
struct PgConn {
  explicit PgConn(const std::string& conninfo);
  // Between transactions the server sends an idle session nothing (sbxd does not LISTEN):
  // anything to read, or a hangup, is its goodbye (a restart, pg_terminate_backend). libpqxx's
  // silent reconnection is off, so the pool asks this before it hands a connection out.
  bool IdleAndOpen();
  pqxx::connection conn;
  std::unordered_map<const char*, std::string> prepared;
  // Its session state is unknown (a batch that prepared statements failed, or a ROLLBACK did):
  // the pool drops it rather than guess.
  bool poisoned = false;
};

// A libpqxx failure as a Status: "store: <step>: <PostgreSQL's first line>", the code by kind.
absl::Status PgError(const pqxx::pqxx_exception& e, std::string_view step);
// A serialization failure or a deadlock: the whole transaction may run again.
bool IsRetryable(const pqxx::pqxx_exception& e);

// Round trips are what a transaction costs here (each one wakes the server's process and
// ours), so a transaction sends as few as it can. Every statement travels as text in one simple
// query with what the transaction still owes the server: its BEGIN (sent with the first
// statement, none at all for a transaction that runs none), the PREPARE of a statement new to
// the connection, and the writes queued since the last read. Writes whose result no caller
// reads (Queue) wait for the next read or ride with the COMMIT, so "read, read, write, write,
// commit" costs three round trips, not seven. A queued write that fails fails the transaction
// at that read or at the commit, with its step named, as it would have a statement later.
class PgBatch {
 public:
  // `autocommit`: Store::Read's, no BEGIN and no COMMIT: each statement on its own, and no
  // write. `begin_timer` and `commit_timer` time the round trips that carry BEGIN and COMMIT.
  PgBatch(PgConn& conn, pqxx::nontransaction& tx, bool autocommit,
          metrics::Histogram& begin_timer, metrics::Histogram& commit_timer)
      : conn_(conn),
        tx_(tx),
        autocommit_(autocommit),
        begin_timer_(begin_timer),
        commit_timer_(commit_timer) {}
  // A transaction neither committed nor rolled back (fn threw) must not stay open on a pooled
  // connection: the next user's statements would join it.
  ~PgBatch() {
    if (begun_sent_ && !ended_) Rollback();
  }
  PgBatch(const PgBatch&) = delete;
  PgBatch& operator=(const PgBatch&) = delete;

  // Runs one statement, with whatever is queued before it; its result. After a failure the
  // transaction is spent: this and every later call return the first failure.
  absl::StatusOr<pqxx::result> Exec(const char* sql, std::string_view step, const PgParams& p);
  // A write whose result nobody reads: sent with the next statement of the transaction.
  // `step` is kept until then: a literal.
  absl::Status Queue(const char* sql, std::string_view step, const PgParams& p);
  // Sends what is queued and COMMIT in one round trip; nothing when no statement ran.
  absl::Status Commit();
  void Rollback() noexcept;

  // The first failure inside this transaction: PostgreSQL refuses every later statement of
  // it, so the transaction cannot commit whatever fn returns.
  const absl::Status& failure() const { return failure_; }
  bool retryable() const { return retryable_; }

 private:
  // "EXECUTE name(literals)" for `sql`, after its PREPARE when the connection lacks it.
  absl::StatusOr<std::string> Statement(const char* sql, std::string_view step,
                                        const PgParams& p);
  // One round trip: BEGIN if not yet sent, the queued writes, then `last` (whose step is
  // `step`); its result. A failure names the queued writes' steps too.
  absl::StatusOr<pqxx::result> Send(std::string_view last, std::string_view step);

  PgConn& conn_;
  pqxx::nontransaction& tx_;
  const bool autocommit_;
  metrics::Histogram& begin_timer_;
  metrics::Histogram& commit_timer_;
  absl::Status failure_;
  bool retryable_ = false;
  bool begun_ = false;       // a statement ran or is queued to run after BEGIN
  bool begun_sent_ = false;  // the server has seen the BEGIN (or, autocommit, a statement)
  bool ended_ = false;
  std::string pending_;  // queued statements, each ending in ";\n"
  std::vector<std::string_view> pending_steps_;  // the callers' literals
  std::unordered_map<const char*, std::string> preparing_;  // in the batch being sent
};

}  // namespace sbx::store
