#include "store/open_store.h"

#include <filesystem>

#include <fmt/format.h>

#include "absl/strings/match.h"
#include "store/pg_store.h"
#include "store/sqlite_store.h"

namespace sbx::store {
namespace {

bool IsPostgres(const std::string& url) {
  return absl::StartsWith(url, "postgresql://") || absl::StartsWith(url, "postgres://");
}

// The SQLite file `url` names; empty when it names none.
std::string SqlitePath(const std::string& url, const std::string& state_dir) {
  if (url.empty()) return (std::filesystem::path(state_dir) / "sbx.db").string();
  if (absl::StartsWith(url, "sqlite://")) return url.substr(9);  // sqlite:///abs -> /abs
  if (absl::StartsWith(url, "/")) return url;
  return {};
}

}  // namespace

absl::Status ValidateStoreUrl(const std::string& url) {
  if (url.empty() || IsPostgres(url)) return absl::OkStatus();
  const std::string path = SqlitePath(url, "/");
  if (!path.empty() && absl::StartsWith(path, "/")) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format(
      "store.url \"{}\": expected an absolute SQLite path, sqlite:///<path>, postgresql://... or "
      "postgres://...",
      RedactStoreUrl(url)));
}

absl::StatusOr<StorePtr> OpenStore(const StoreConfig& config, const std::string& state_dir,
                                   metrics::Registry& registry) {
  if (absl::Status st = ValidateStoreUrl(config.url); !st.ok()) return st;
  if (IsPostgres(config.url)) {
    PgStoreOptions options;
    options.pool_size = config.pool_size;
    return OpenPgStore(config.url, options, registry);
  }
  return OpenSqliteStore(SqlitePath(config.url, state_dir), registry);
}

std::string DescribeStore(const StoreConfig& config, const std::string& state_dir) {
  if (IsPostgres(config.url)) return "postgresql " + RedactStoreUrl(config.url);
  return "sqlite " + SqlitePath(config.url, state_dir);
}

}  // namespace sbx::store
