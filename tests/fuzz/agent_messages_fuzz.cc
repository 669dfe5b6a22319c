// Fuzz targets for the typed agent messages (src/protocol/messages.h), one per decoder family,
// chosen at compile time by SBX_FUZZ_DECODER: "request" (DecodeRequest: every request type,
// as the agent reads them from sbxd), "reply" (every reply type, as sbxd reads them from an
// agent its guest may control), "spec" (SessionSpec, which the service also reads back from
// its store) and "watch" (a watch event). Properties: never crashes or throws; whatever
// decodes re-encodes to bytes that decode to the same encoding (the wire form is stable).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "deep_json_seeds.h"
#include "protocol/messages.h"

namespace {
using namespace sbx::protocol;

void Check(bool cond) {
  if (!cond) std::abort();
}

template <typename T>
void RoundTrip(const Json& j) {
  auto first = T::FromJson(j);
  if (!first.ok()) {
    Check(first.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  const std::string wire = DumpJson(first->ToJson());
  auto parsed = ParseObjectPayload(wire, "again");
  Check(parsed.ok());
  auto second = T::FromJson(*parsed);
  Check(second.ok() && DumpJson(second->ToJson()) == wire);
}

template <typename T>
void Reply(std::string_view in) {
  auto r = DecodeReply<T>(in, "reply");
  if (!r.ok()) return;  // the agent's error or bad_agent_reply, never a throw
  auto again = DecodeReply<T>(DumpJson(r->ToJson()), "reply");
  Check(again.ok() && DumpJson(again->ToJson()) == DumpJson(r->ToJson()));
}

const std::string kSeeds[] = {
    R"({"op":"attach","session_id":"s","spec":)" + sbx::fuzz::DeepArrays(63) + "}",
    R"({"ok":false,"error":)" + sbx::fuzz::DeepObjects(1000) + "}",
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kSeeds[0].c_str(),
    kSeeds[1].c_str(),
    R"({"op":"attach","session_id":"s","after_event_id":3,"spec":{"argv":["sh"],"cwd":"/",)"
    R"("env":{"A":"b"},"user":"root","tty":{"rows":3,"cols":4},"stdin":true,"timeout_s":5}})",
    R"({"op":"signal","session_id":"s","signal":"TERM"})",
    R"({"op":"write","path":"/f","mode":420,"uid":1,"gid":2,"user":"u","mkdirs":true,"max_bytes":9})",
    R"({"op":"read","path":"/f","offset":1,"length":2,"suffix":3})",
    R"({"op":"resize","session_id":"s","rows":1,"cols":65535})",
    R"({"argv":["a","b"],"env":{"K":"V"},"tty":true,"kill_grace_s":300})",
    R"({"ok":true,"state":"exited","pid":1,"exit_code":-1,"signal":"SIGKILL","tty":true})",
    R"({"ok":true,"entry":{"name":"f","path":"/f","type":"file","size":1,"mode":420,"uid":0,)"
    R"("gid":0,"mtime":"t"},"satisfiable":true,"offset":0,"length":1})",
    R"({"ok":true,"entries":3,"skipped":0})",
    R"({"type":"move","path":"/b","is_dir":false,"from":"/a"})",
    R"({"ok":"yes","started":"no","state":5})",
    "[]", "null", "{", "",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string_view decoder = SBX_FUZZ_DECODER;
  if (decoder == "reply") {
    Reply<AttachReply>(in);
    Reply<StatusReply>(in);
    Reply<QueuedReply>(in);
    Reply<EntryReply>(in);
    Reply<ReadReply>(in);
    Reply<WriteTarEnd>(in);
    return 0;
  }
  auto j = ParseObjectPayload(in, "payload");
  if (!j.ok()) return 0;
  if (decoder == "request") {
    auto r = RequestFromJson(*j);
    if (!r.ok()) return 0;
    const std::string wire = std::visit([](const auto& v) { return EncodeRequest(v); }, *r);
    auto again = DecodeRequest(wire);
    Check(again.ok() && OpOf(*again) == OpOf(*r));
    Check(std::visit([](const auto& v) { return EncodeRequest(v); }, *again) == wire);
  } else if (decoder == "spec") {
    RoundTrip<SessionSpec>(*j);
  } else {
    RoundTrip<WatchEvent>(*j);
  }
  return 0;
}
