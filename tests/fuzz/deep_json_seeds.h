// Deeply nested JSON for the fuzz targets' seeds (issue 13, finding 1): the texts that once
// overflowed sbxd's stack, and the neighbours of the depth limit. Mutations of these reach the
// pre-scan's edge cases (brackets in strings, escapes, unbalanced input) at depth.
#pragma once

#include <string>

namespace sbx::fuzz {

inline std::string DeepArrays(int levels, const std::string& inner = "") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

inline std::string DeepObjects(int levels) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += "{\"a\":";
  return s + "1" + std::string(levels, '}');
}

// The WebSocket message of the finding: 781 KiB, under the 1 MiB message limit.
inline std::string DeepResize(int levels = 400000) {
  return "{\"type\":\"resize\",\"cols\":10,\"rows\":" + DeepArrays(levels) + "}";
}

inline std::string DeepSignal(int levels = 400000) {
  return "{\"type\":\"signal\",\"signal\":" + DeepArrays(levels) + "}";
}

// Brackets that are not nesting: inside strings, behind escaped quotes and backslashes.
inline std::string BracketsInStrings() {
  return "{\"data\":\"" + std::string(1000, '[') + "\\\"\\\\\",\"x\":\"}}]]\\u005b\"}";
}

}  // namespace sbx::fuzz
