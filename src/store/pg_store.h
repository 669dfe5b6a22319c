#pragma once

#include <string>

#include "common/metrics.h"
#include "store/store.h"

namespace sbx::store {

struct PgStoreOptions {
  // Connections kept open; at most this many transactions run at once.
  int pool_size = 4;
  // Attempts of one Transact when PostgreSQL reports a serialization failure or a deadlock
  // (another transaction touched the same rows); then Transact fails with Aborted.
  int max_attempts = 16;
};

// Opens the PostgreSQL database at `url` ("postgresql://user:pass@host:port/db?..." or
// "postgres://..."; libpq's keywords and environment apply), creates or migrates its schema and
// returns a Store whose transactions run at SERIALIZABLE isolation. A transaction that loses a
// serialization race is rolled back and its fn run again (up to max_attempts): fn must only
// read and write through its Tx and state it resets itself (store.h). Connects with a 10 s
// timeout unless the URL sets connect_timeout. Errors name the URL with its password hidden.
absl::StatusOr<StorePtr> OpenPgStore(const std::string& url, const PgStoreOptions& options = {},
                                     metrics::Registry& registry = metrics::Default());

// `url` with the password of its user-info (and any password= parameter) replaced by "***":
// what logs, errors and --print-config may show.
std::string RedactStoreUrl(const std::string& url);

}  // namespace sbx::store
