// Fuzz target for everything sbxd parses from an HTTP request: the request target (path and
// query), the create-sandbox and create-session bodies, the session data-plane bodies (stdin,
// signal, resize, lifecycle), the WebSocket control messages, and the header values it
// interprets.
// The property is "never crashes, never throws, always returns a value or a Status".
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/requests.h"
#include "api/target.h"
#include "deep_json_seeds.h"

namespace {
// Bodies nested past the limit (issue 13): each route's parser must refuse them before
// anything walks the tree.
const std::string kDeep[] = {
    R"({"argv":)" + sbx::fuzz::DeepArrays(400000) + "}",
    R"({"resources":)" + sbx::fuzz::DeepObjects(150000) + "}",
    R"({"signal":)" + sbx::fuzz::DeepArrays(65) + "}",
    R"({"rows":)" + sbx::fuzz::DeepArrays(64) + R"(,"cols":1})",
    sbx::fuzz::DeepResize(), sbx::fuzz::DeepSignal(), sbx::fuzz::BracketsInStrings(),
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kDeep[0].c_str(), kDeep[1].c_str(), kDeep[2].c_str(), kDeep[3].c_str(), kDeep[4].c_str(),
    kDeep[5].c_str(), kDeep[6].c_str(),
    R"j({"type":"resize","rows":24,"cols":80})j", R"j({"type":"stdin_close"})j",
    R"j({"template":"base","resources":{"vcpu":2,"memory_mib":512,"disk_mib":1024}})j",
    R"j({"env":{"A":"1","B_2":"x"},"labels":{"team":"ml","a/b":"c"},"runtime":"ns"})j",
    R"j({"timeout_s":60,"idle_suspend_s":0,"egress_profile":"none"})j",
    R"j({"argv":["python3","-c","print('hi')"],"cwd":"/tmp","env":{"X":"y"},"user":"root"})j",
    R"j({"argv":["sh"],"tty":false,"stdin":false,"timeout_s":null})j",
    R"j({"argv":["bash"],"tty":{"rows":24,"cols":80},"stdin":true,"timeout_s":5,)j"
    R"j("kill_grace_s":1})j",
    R"j({"data":"hello\n"})j", R"j({"data_b64":"aGk="})j", R"j({"signal":"SIGTERM"})j",
    R"j({"rows":40,"cols":120})j",
    "/v1/sandboxes?state=running&label=team%3Dml&limit=10&page_token=abc",
    "/v1/sessions/ses_aaaaaaaaaaaaaaaaaaaa/attach?token=sat1.x.y&last_event_id=42",
    "42", "team=ml", "Idempotency-Key-1",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  sbx::api::ResourceLimits limits;
  (void)sbx::api::ParseCreateSandbox(in, limits);
  (void)sbx::api::ParseCreateSession(in);
  (void)sbx::api::ParseTarget(in);
  (void)sbx::api::ParseLastEventId(in);
  (void)sbx::api::ParseLabelFilter(in);
  (void)sbx::api::ValidateIdempotencyKey(in);
  (void)sbx::api::ParseLimit(in);
  (void)sbx::api::ParseStdinBody(in, /*json_body=*/true);
  (void)sbx::api::ParseSignalBody(in);
  (void)sbx::api::ParseResizeBody(in);
  (void)sbx::api::ParseWsControl(in);
  (void)sbx::api::ParseLifecycleBody(in);
  (void)sbx::api::ParseEgressPatch(in);
  (void)sbx::api::ParseTenantSpec(in, /*create=*/true);
  (void)sbx::api::ParseTenantSpec(in, /*create=*/false);
  (void)sbx::api::ParseTokenSpec(in);
  return 0;
}
