// Fuzz target for the JSON payloads that cross the agent socket (src/protocol/protocol.h):
// requests as the agent reads them, responses, end frames and watch events as sbxd reads them
// (a guest that controls its agent controls these bytes). Properties: never crashes or
// throws; an accepted payload is an object that can be dumped and parsed back unchanged; the
// typed field reads and the error mapping sbxd applies to a response never throw, whatever
// the types inside.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "deep_json_seeds.h"
#include "protocol/protocol.h"
#include "protocol/messages.h"

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}

const std::string kSeeds[] = {
    R"({"ok":true,"entries":)" + sbx::fuzz::DeepArrays(400000) + "}",
    R"({"ok":false,"error":)" + sbx::fuzz::DeepObjects(150000) + "}",
    R"({"op":"attach","session_id":"s","spec":)" + sbx::fuzz::DeepArrays(63) + "}",
    R"({"op":"attach","session_id":"s","spec":)" + sbx::fuzz::DeepArrays(64) + "}",
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kSeeds[0].c_str(), kSeeds[1].c_str(), kSeeds[2].c_str(), kSeeds[3].c_str(),
    R"({"ok":true,"started":true,"pid":42})",
    R"({"ok":true,"state":"exited","exit_code":0,"signal":null,"started_at":"x"})",
    R"({"ok":"yes","started":"no","state":5})",
    R"({"ok":false,"error":{"code":"not_found","message":"gone","reason":"no_such_file"}})",
    R"({"ok":false,"error":{"code":7,"message":["m"],"reason":{}}})",
    R"({"ok":false,"error":"flat"})", R"({"type":"create","path":"/a","is_dir":false})",
    R"({"ok":true,"entry":{"size":"big"},"offset":-1,"satisfiable":"no"})",
    R"({"op":"ping"})", "[]", "null", "{", "",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto j = sbx::protocol::ParseObjectPayload(in, "payload");
  if (!j.ok()) {
    Check(j.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  Check(j->is_object());
  const std::string text = j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  auto again = sbx::protocol::ParseObjectPayload(text, "again");
  Check(again.ok() && *again == *j);
  (void)sbx::protocol::ResponseOk(*j);
  (void)sbx::protocol::StringField(*j, "state");
  (void)sbx::protocol::BoolField(*j, "started");
  if (auto err = j->find("error"); err != j->end()) {
    (void)sbx::protocol::StringField(*err, "code");
  }
  const absl::Status s = sbx::protocol::ErrorReply::FromJson(*j).ToStatus();
  Check(!s.ok());
  return 0;
}
