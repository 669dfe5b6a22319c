#pragma once

#include <string>

#include "store/store.h"

namespace sbx::store {

// Opens (creating if needed) the SQLite database at `path`, switches it to WAL and applies the
// versioned migrations in order. Fails with the SQLite message if the file is not a database
// or comes from a newer schema version than this binary knows.
absl::StatusOr<StorePtr> OpenSqliteStore(const std::string& path);

}  // namespace sbx::store
