#include "store/sqlite_handle.h"

#include <chrono>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace sbx::store {
namespace {

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

}  // namespace

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

}  // namespace sbx::store
