#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace sbx {

// RFC 3339 UTC with millisecond precision: "2026-11-30T05:51:26.123Z".
std::string FormatRfc3339(std::chrono::system_clock::time_point t);
// The inverse, for exactly that form (what this process wrote); nullopt for anything else.
std::optional<std::chrono::system_clock::time_point> ParseRfc3339(const std::string& s);
inline std::string NowRfc3339() { return FormatRfc3339(std::chrono::system_clock::now()); }

}  // namespace sbx
