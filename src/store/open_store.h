#pragma once

#include <string>

#include "common/metrics.h"
#include "store/store.h"

namespace sbx::store {

struct StoreConfig {
  // "" (the default): SQLite at <state_dir>/sbx.db. An absolute path or "sqlite:///<path>":
  // SQLite there. "postgresql://..." or "postgres://...": PostgreSQL (docs/store.md).
  std::string url;
  int pool_size = 4;  // PostgreSQL connections
};

// Refuses a URL this binary cannot open (another scheme, a relative path) with InvalidArgument
// naming the value (its password hidden); config checks call it before anything starts.
absl::Status ValidateStoreUrl(const std::string& url);

// Opens the store `config` names, creating or migrating its schema.
absl::StatusOr<StorePtr> OpenStore(const StoreConfig& config, const std::string& state_dir,
                                   metrics::Registry& registry = metrics::Default());

// "sqlite <path>" or "postgresql <url with the password hidden>", for logs and /v1/info-like
// output.
std::string DescribeStore(const StoreConfig& config, const std::string& state_dir);

}  // namespace sbx::store
