// Fuzz target for the rewriting of guest-sized agent replies (src/protocol/guest_reply.h):
// the process list and directory listings, as a compromised agent could send them. Properties:
// never crashes or throws; an accepted reply becomes a body that parses as JSON, holds at most
// the schema's entries, and is no bigger than the payload allows; a refused one is
// bad_agent_reply or the agent's own error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status_util.h"
#include "deep_json_seeds.h"
#include "protocol/guest_reply.h"
#include "protocol/limits.h"

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}

const std::string kSeeds[] = {
    R"({"ok":true,"processes":[{"argv":)" + sbx::fuzz::DeepArrays(400000) + "}]}",
    R"({"ok":true,"entries":[)" + sbx::fuzz::DeepObjects(150000) + "]}",
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kSeeds[0].c_str(),
    kSeeds[1].c_str(),
    R"({"ok":true,"processes":[{"pid":7,"ppid":1,"pgid":7,"state":"S","comm":"sh","argv":["sh","-c","x\"y"],"argv_truncated":false,"uid":0,"user":"root","started_at":null,"session_id":"ses_1"}],"truncated":false})",
    R"({"ok":true,"entries":[{"name":"a","path":"/a","type":"file","size":3,"mode":420,"uid":0,"gid":0,"mtime":"2026-01-01T00:00:00Z"}],"truncated":true})",
    R"({"ok":false,"error":{"code":"not_found","message":"gone","reason":"path_not_found"}})",
    R"({"ok":true,"processes":[{"pid":1,"pid":2}]})",
    R"({"ok":true,"processes":[],"processes":[]})",
    R"({"ok":true,"processes":[{"argv":["\u0000","\ud83d\ude42"]}]})",
    "[]", "null", "{", "",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (const auto* schema :
       {&sbx::protocol::ProcessesReplySchema(), &sbx::protocol::ListReplySchema()}) {
    auto r = sbx::protocol::RewriteGuestList(in, *schema, "{\"sandbox_id\":\"s\",");
    if (!r.ok()) {
      Check(!r.status().message().empty());
      continue;
    }
    // Escapes can grow a string 6x (\u00XX per control byte), never more.
    Check(r->size() <= 64 + 6 * in.size());
    auto j = nlohmann::json::parse(*r, nullptr, /*allow_exceptions=*/false);
    Check(!j.is_discarded() && j.is_object());
    const auto& list = j[std::string(schema->list_key)];
    Check(list.is_array() && list.size() <= schema->max_entries);
    Check(j["truncated"].is_boolean());
  }
  return 0;
}
