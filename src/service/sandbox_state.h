// Sandbox states and the transitions between them, in one place.
//
//   creating --create ok--> running --delete--> deleting --> deleted
//      |                      |   ^                 ^  |
//      |          pause ok /  |   | wake ok         |  |
//      |        suspend ok    v   |                 |  |
//      |                 paused | suspended --delete+  |
//      |                                               |
//      +--create failed--> failed --delete-------------+--destroy failed--> failed
//   any state but deleted --delete--> deleting (delete wins over in-flight work)
//
// A pause, suspend or wake operation leaves the state as it is while it runs (the sandbox's
// current_operation_id names it) and moves it only when it succeeds. After an sbxd restart an
// interrupted one is failed and the state is taken from the kernel: frozen -> paused (or the
// stored paused/suspended), not frozen -> running.
#pragma once

#include <string_view>

namespace sbx::service {

inline constexpr std::string_view kCreating = "creating";
inline constexpr std::string_view kRunning = "running";
inline constexpr std::string_view kPaused = "paused";
inline constexpr std::string_view kSuspended = "suspended";
inline constexpr std::string_view kFailed = "failed";
inline constexpr std::string_view kDeleting = "deleting";
inline constexpr std::string_view kDeleted = "deleted";

// Every state but deleted (deleted rows are kept for good): what sbx_sandboxes reports.
inline constexpr std::string_view kLiveStates[] = {kCreating, kRunning, kPaused,
                                                   kSuspended, kFailed,  kDeleting};

inline bool IsSandboxState(std::string_view s) {
  return s == kCreating || s == kRunning || s == kPaused || s == kSuspended || s == kFailed ||
         s == kDeleting || s == kDeleted;
}

// Paused and suspended sandboxes are frozen: their processes exist but do not run.
inline bool IsFrozenState(std::string_view s) { return s == kPaused || s == kSuspended; }

}  // namespace sbx::service
