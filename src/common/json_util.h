// Parsing JSON that comes from the other side of a trust boundary: API bodies, WebSocket
// control messages, agent frames (for sbxd), requests (for the agent).
//
// nlohmann's parser is iterative, but most of what one then does with the value is not:
// dump(), the copy constructor, operator== and the typed getters of nested values recurse once
// per level. A 781 KiB message of 400,000 '[' overflows any thread's stack in dump(); the
// parser itself would have built that tree happily. So every untrusted text is measured first,
// with a loop and no allocation, and refused before a tree deeper than `max_depth` exists.
// What comes out of ParseUntrustedJson is then safe to dump, copy and compare: recursion over
// it is bounded by max_depth frames. (Destruction is iterative in nlohmann 3.11.)
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx {

// Arrays and objects open at once, at most. Nothing sbx exchanges nests more than a handful
// of levels (a session spec inside a sandbox view inside a list is 5); 64 leaves room and
// keeps the deepest recursion over a value a few KiB of stack.
inline constexpr int kMaxUntrustedJsonDepth = 64;

// The nesting depth of `text`: the most arrays and objects open at one point ("1" and "\"[\""
// are 0, "[]" is 1, "{\"a\":[1]}" is 2), counting brackets outside strings only. For text that
// is valid JSON this is exactly the depth of the parsed value; for other text it is an upper
// bound of what any parser could build from it before it failed. Stops counting at `stop_at`
// + 1, so a limit check needs no more than one pass and no more than that.
int JsonNestingDepth(std::string_view text, int stop_at);

// Parses `text` (one JSON value, nothing but whitespace after it) if it nests at most
// `max_depth` levels. Never throws. Errors are InvalidArgument: "not valid JSON" (no more: the
// parser's own message quotes the offending token, which can be most of the input), or,
// when it is too deep, "JSON nests deeper than N levels" (IsJsonTooDeep is true for those).
absl::StatusOr<nlohmann::json> ParseUntrustedJson(std::string_view text,
                                                  int max_depth = kMaxUntrustedJsonDepth);

// Whether `s` is ParseUntrustedJson's refusal of a too-deep text. It is a detail on the status
// (status_util.h), which a new status does not inherit: code that rewords the error keeps it
// with WithDetail(s, kJsonTooDeepDetail, "1"). The WebSocket treats a too-deep message as a
// hostile client, not a typo.
inline constexpr char kJsonTooDeepDetail[] = "json_too_deep";
bool IsJsonTooDeep(const absl::Status& s);

}  // namespace sbx
