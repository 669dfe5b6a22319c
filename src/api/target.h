// Request-target parsing: "/v1/sandboxes?state=running&label=a%3Db" -> path segments and
// decoded query parameters. Untrusted input: never throws, rejects malformed escapes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::api {

struct Target {
  std::string path;
  std::vector<std::string> segments;  // "/v1/sandboxes/x" -> {"v1","sandboxes","x"}
  std::map<std::string, std::string> query;  // the last value wins for repeated keys

  std::optional<std::string> Query(const std::string& key) const {
    auto it = query.find(key);
    if (it == query.end()) return std::nullopt;
    return it->second;
  }
};

absl::StatusOr<Target> ParseTarget(std::string_view target);
// Percent-decoding ('+' is a space in query components only).
std::optional<std::string> PercentDecode(std::string_view in, bool plus_is_space);

// SSE wire format of one event. `id` 0 means no id line. `data` must not contain newlines
// (callers pass compact JSON).
std::string SseEvent(uint64_t id, std::string_view event, std::string_view data);

}  // namespace sbx::api
