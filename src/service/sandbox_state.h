// Sandbox states and the transitions between them, in one place.
//
//   creating --create ok--> running --delete--> deleting --> deleted
//      |                       |                   |
//      +--create failed--> failed --delete---------+--destroy failed--> failed
//   any state but deleted --delete--> deleting (delete wins over in-flight work)
#pragma once

#include <string_view>

namespace sbx::service {

inline constexpr std::string_view kCreating = "creating";
inline constexpr std::string_view kRunning = "running";
inline constexpr std::string_view kFailed = "failed";
inline constexpr std::string_view kDeleting = "deleting";
inline constexpr std::string_view kDeleted = "deleted";

inline bool IsSandboxState(std::string_view s) {
  return s == kCreating || s == kRunning || s == kFailed || s == kDeleting || s == kDeleted;
}

}  // namespace sbx::service
