// Fuzz target for an api replica's routing (src/api/cluster_router.h): the target, Host and
// E2b-Sandbox-Id header and the create body of any client, before any authentication (the
// replica authenticates nothing; the node does). Properties: never crashes or throws; an id it
// routes by is non-empty and holds no '/', CR, LF or NUL; a placement read is only ever of a
// JSON object.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "api/cluster_router.h"

extern const char* const kFuzzSeeds[] = {
    "/v1/sandboxes/sbx_abc/files|8080-sbx-abc.sbx.test|{}",
    "/v1/sessions/ses_1/attach||",
    "/sandboxes/sbx-abc/pause||{\"templateID\":\"x\"}",
    "/v1/sandboxes||{\"template\":\"python\",\"resources\":{\"vcpu\":2}}",
    "/v2/sandboxes|sbx-e2b|[1,2]",
    "//v1//operations/:x||",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::string parts[3];
  int i = 0;
  for (char c : in) {
    if (c == '|' && i < 2) {
      ++i;
      continue;
    }
    parts[i] += c;
  }
  // The HTTP parser refuses CR, LF and NUL in a target and a header value before this runs.
  for (int p = 0; p < 2; ++p) {
    for (char& c : parts[p]) {
      if (c == '\r' || c == '\n' || c == '\0') c = ' ';
    }
  }
  for (auto verb : {sbx::http::bhttp::verb::post, sbx::http::bhttp::verb::get}) {
    sbx::http::Request req{verb, parts[0], 11};
    if (!parts[1].empty()) {
      req.set(sbx::http::bhttp::field::host, parts[1]);
      req.set("E2b-Sandbox-Id", parts[1]);
    }
    req.body() = parts[2];
    const sbx::api::RouteKey k = sbx::api::Classify(req, "sbx.test");
    using Kind = sbx::api::RouteKey::Kind;
    if (k.kind == Kind::kSandbox || k.kind == Kind::kSession || k.kind == Kind::kOperation) {
      Check(k.id.find_first_of(std::string("/\r\n\0", 4)) == std::string::npos);
    }
    (void)sbx::api::ClusterRouter::StreamsBody(req);
    for (bool e2b : {false, true}) (void)sbx::api::PlacementOf(req, e2b);
  }
  return 0;
}
