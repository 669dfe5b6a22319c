// RAII owners for SQLite handles, a cursor that binds, steps and reads one prepared statement,
// and what a failed SQLite call becomes. Internal to the store; nothing outside src/store
// includes this.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace sbx::store {

// Each busy wait already blocks up to kBusyTimeoutMs inside SQLite; the retries on top only
// cover the cases where SQLite returns SQLITE_BUSY without consulting the busy handler.
inline constexpr int kBusyTimeoutMs = 5000;
inline constexpr int kBusyRetries = 2;

// "store: <step>: <sqlite message>", with a code for the result code (a primary key clash is
// AlreadyExists, BUSY Unavailable, ...). Call before anything else touches the connection,
// since sqlite3_errmsg describes only the most recent call.
absl::Status SqliteError(sqlite3* db, int rc, std::string_view step);
bool IsBusy(int rc);
// The pause before retry `attempt` (0, 1, ...) after SQLITE_BUSY.
void BackoffSleep(int attempt);

struct SqliteDbCloser {
  // close_v2 defers the close until every statement is finalized, so destruction order between
  // a connection and its statement cache cannot leak or crash.
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using SqliteDb = std::unique_ptr<sqlite3, SqliteDbCloser>;

struct SqliteStmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using SqliteStmt = std::unique_ptr<sqlite3_stmt, SqliteStmtFinalizer>;

// Borrows a cached statement for one use. Binding errors are sticky: the first failing bind's
// result code is kept and reported by Step(), so call sites can bind without checking each one.
// The destructor resets the statement and clears its bindings so the cache never holds a
// half-read cursor (which would keep a read transaction open) or stale values.
class StmtCursor {
 public:
  explicit StmtCursor(sqlite3_stmt* stmt) : stmt_(stmt) {}
  StmtCursor(const StmtCursor&) = delete;
  StmtCursor& operator=(const StmtCursor&) = delete;
  ~StmtCursor() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  StmtCursor& Bind(int idx, std::string_view v) {
    // TRANSIENT: SQLite copies, so temporaries (JSON dumps) may die before Step().
    Keep(sqlite3_bind_text64(stmt_, idx, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
    return *this;
  }
  StmtCursor& Bind(int idx, const std::string& v) { return Bind(idx, std::string_view(v)); }
  StmtCursor& Bind(int idx, const char* v) { return Bind(idx, std::string_view(v)); }
  StmtCursor& Bind(int idx, int64_t v) {
    Keep(sqlite3_bind_int64(stmt_, idx, v));
    return *this;
  }
  StmtCursor& Bind(int idx, int v) { return Bind(idx, int64_t{v}); }
  StmtCursor& Bind(int idx, bool v) { return Bind(idx, int64_t{v ? 1 : 0}); }
  StmtCursor& BindNull(int idx) {
    Keep(sqlite3_bind_null(stmt_, idx));
    return *this;
  }
  template <typename T>
  StmtCursor& Bind(int idx, const std::optional<T>& v) {
    return v.has_value() ? Bind(idx, *v) : BindNull(idx);
  }

  // SQLITE_ROW, SQLITE_DONE, or an error code (including a deferred bind failure).
  int Step() {
    if (bind_rc_ != SQLITE_OK) return bind_rc_;
    return sqlite3_step(stmt_);
  }

  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    if (p == nullptr) return {};
    return std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  std::optional<std::string> OptText(int col) const {
    if (IsNull(col)) return std::nullopt;
    return Text(col);
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::optional<int64_t> OptInt(int col) const {
    if (IsNull(col)) return std::nullopt;
    return Int(col);
  }

 private:
  void Keep(int rc) {
    if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  sqlite3_stmt* stmt_;
  int bind_rc_ = SQLITE_OK;
};

}  // namespace sbx::store
