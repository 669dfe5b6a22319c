// The store's schema: its versioned migrations, and the set-up every connection gets before
// its first transaction. Internal to the store.
#pragma once

#include <sqlite3.h>

#include <string>

#include "absl/status/status.h"

namespace sbx::store {

// Readies a freshly opened connection to the database at `path` (named in messages): busy
// timeout, WAL, synchronous=NORMAL, foreign keys, then the migrations this binary knows, under a
// write lock. Fails with the SQLite message if the file is not a database, and with
// FailedPrecondition if its schema is newer than this binary knows (before changing anything).
absl::Status PrepareSchema(sqlite3* db, const std::string& path);

}  // namespace sbx::store
