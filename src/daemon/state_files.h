#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace sbx::daemon {

// Creates the state dir (mode 0700) if needed.
absl::Status EnsureStateDir(const std::string& dir);
// Returns `given` (and writes it to `path`, mode 0600) when non-empty; else the secret already
// in `path`; else a new random one written there.
absl::StatusOr<std::string> LoadOrCreateSecret(const std::filesystem::path& path,
                                               const std::string& given);

}  // namespace sbx::daemon
