#include "common/json_util.h"

#include <exception>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx {

int JsonNestingDepth(std::string_view text, int stop_at) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      // An escape's next character never ends the string (\" and \\ included; the four hex
      // digits of \u hold neither '"' nor '\'), which is how JSON's lexer reads it too.
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > stop_at) return deepest;
        }
        break;
      case ']':
      case '}':
        // More closing than opening brackets: not JSON, the parser refuses it; counting on
        // from 0 keeps the result an upper bound all the same.
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

absl::StatusOr<nlohmann::json> ParseUntrustedJson(std::string_view text, int max_depth) {
  if (JsonNestingDepth(text, max_depth) > max_depth) {
    return WithDetail(absl::InvalidArgumentError(
                          fmt::format("JSON nests deeper than {} levels", max_depth)),
                      kJsonTooDeepDetail, "1");
  }
  try {
    nlohmann::json j =
        nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
    return j;
  } catch (const std::exception& e) {
    // allow_exceptions=false covers syntax errors; this is for what remains (bad_alloc).
    return absl::InvalidArgumentError(fmt::format("not valid JSON: {}", e.what()));
  }
}

bool IsJsonTooDeep(const absl::Status& s) { return !ApiErrorDetail(s, kJsonTooDeepDetail).empty(); }

}  // namespace sbx
