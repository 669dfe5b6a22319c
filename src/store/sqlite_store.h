#pragma once

#include <string>

#include "common/metrics.h"
#include "store/store.h"

namespace sbx::store {

// Opens (creating if needed) the SQLite database at `path`, switches it to WAL and applies the
// versioned migrations in order. Fails with the SQLite message if the file is not a database
// or comes from a newer schema version than this binary knows. Each statement's time goes to
// sbx_store_query_duration_seconds{op} in `registry` (op: the Tx method, or Begin/Commit).
absl::StatusOr<StorePtr> OpenSqliteStore(const std::string& path,
                                         metrics::Registry& registry = metrics::Default());

}  // namespace sbx::store
