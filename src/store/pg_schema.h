// PostgreSQL's tables and their versioned migrations. Internal to the store.
#pragma once

#include <string>

#include <pqxx/pqxx>

#include "absl/status/status.h"

namespace sbx::store {

// The schema version this binary writes (the same number as SQLite's PRAGMA user_version).
int PgSchemaVersion();

// Creates or migrates the schema under an advisory lock, so several sbxd processes starting on
// one database migrate it once. Refuses a database of a newer version. Throws what libpqxx
// throws (the caller turns it into a Status); `where` names the database in messages.
absl::Status PreparePgSchema(pqxx::connection& conn, const std::string& where);

}  // namespace sbx::store
