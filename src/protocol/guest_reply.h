// Guest-sized agent replies ("processes", "list") turned into the API's response body without
// ever building a tree of them (issue 13, finding 6). A parsed nlohmann tree costs 30-100x the
// text for many small strings (160 processes x 32,000 empty argv entries: a 14 MiB reply grew
// sbxd by 673 MiB), so the reply is read once by a SAX pass that checks it against a fixed
// schema and the bounds of protocol/limits.h and writes the client's JSON as it goes: sbxd
// holds the agent's payload and the body it writes, nothing else.
//
// What the agent sends: {"ok":true,"<list_key>":[{entry}...],"truncated":bool} or
// {"ok":false,"error":{"code","message"[,"reason"]}}. An entry's fields are scalars, and at most
// one field (`array_field`) is an array of strings. Fields outside the schema are dropped
// (the API documents every field it returns); anything else — another nesting, a wrong type,
// a duplicate field, more entries, longer strings or more array items than the bounds allow,
// bytes that are not JSON — makes the whole reply ApiError "bad_agent_reply" (502): a correct
// agent never sends it, so a cut-down answer would only hide a broken or hostile one.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx::protocol {

struct GuestListSchema {
  std::string_view list_key;                    // "processes" | "entries"
  std::span<const std::string_view> fields;     // what an entry may carry (at most 32)
  std::string_view array_field;                 // the one array-of-strings field, or ""
  size_t max_entries = 0;
};

// The agent's "processes" and "list" replies (protocol.h documents both).
const GuestListSchema& ProcessesReplySchema();
const GuestListSchema& ListReplySchema();

// `head` opens the client's object and ends with a comma or "{" (e.g. `{"sandbox_id":"s1",`);
// the result is head + `"<list_key>":[...],"truncated":b}`. An agent error reply comes back as
// the agent's status (AgentErrorFromFields).
absl::StatusOr<std::string> RewriteGuestList(std::string_view payload,
                                             const GuestListSchema& schema,
                                             std::string_view head);

// The status of an agent's {"ok":false,"error":{...}}: canonical code from "code", the API code
// from "reason" when present (file operations), else from "code".
absl::Status AgentErrorFromFields(std::string_view code, std::string_view message,
                                  std::string_view reason);

// Appends `s` as a JSON string literal (quotes, backslash and control bytes escaped; the
// bytes are already valid UTF-8, which the parser checked).
void AppendJsonString(std::string& out, std::string_view s);

}  // namespace sbx::protocol
