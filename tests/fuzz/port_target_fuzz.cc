// Fuzz target for port exposure's addressing (src/api/port_target.h): the request target and
// Host header of any client, authenticated or not. Properties: never crashes or throws; an
// accepted address has a port in 1..65535 and an upstream target that starts with '/' and holds
// no CR, LF or NUL (nothing the client wrote can start a header line upstream); a rejected port
// names the field.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "api/port_target.h"
#include "common/status_util.h"

extern const char* const kFuzzSeeds[] = {
    "/v1/sandboxes/sbx_abc/ports/8080/a?b",
    "/v1/sandboxes/sbx_abc/ports/0",
    "/v1/sandboxes/sbx_abc/ports/65536/x",
    "/v1/sandboxes//ports/1",
    "8080-sbx_abc.sbx.test:7070|/x",
    "x-y.z.sbx.test|/",
    "-sbx.test|",
    "1-.sbx.test.|?q",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}
void CheckAddress(const std::optional<absl::StatusOr<sbx::api::PortAddress>>& m) {
  if (!m) return;
  if (!m->ok()) {
    const std::string field = sbx::ApiErrorField(m->status());
    Check(field == "port" || field == "host");
    return;
  }
  const auto& a = **m;
  Check(a.port >= 1);
  Check(!a.upstream_target.empty() && a.upstream_target[0] == '/');
  Check(a.upstream_target.find_first_of(std::string("\r\n\0", 3)) == std::string::npos);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  // The HTTP parser refuses CR, LF and NUL in a target and a header value before this code
  // runs: the fuzzer does the same, then checks that nothing introduces them.
  for (char& c : in) {
    if (c == '\r' || c == '\n' || c == '\0') c = ' ';
  }
  CheckAddress(sbx::api::MatchPortPath(in));
  const size_t cut = in.find('|');
  const std::string host = cut == std::string::npos ? in : in.substr(0, cut);
  const std::string target = cut == std::string::npos ? "/" : in.substr(cut + 1);
  CheckAddress(sbx::api::MatchPortHost(host, target, "sbx.test"));
  return 0;
}
