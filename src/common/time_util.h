#pragma once

#include <chrono>
#include <string>

namespace sbx {

// RFC 3339 UTC with millisecond precision: "2026-11-30T05:51:26.123Z".
std::string FormatRfc3339(std::chrono::system_clock::time_point t);
inline std::string NowRfc3339() { return FormatRfc3339(std::chrono::system_clock::now()); }

}  // namespace sbx
