// The polling watchers of envd's filesystem service (CreateWatcher, GetWatcherEvents,
// RemoveWatcher; envd_filesystem.cc).
#pragma once

namespace sbx::api::e2b {

struct WatcherTable {};

}  // namespace sbx::api::e2b
