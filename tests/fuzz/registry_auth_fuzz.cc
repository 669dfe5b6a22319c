// Fuzz target for what a registry and its token service say about auth and errors
// (src/registry/auth.h): WWW-Authenticate challenges, token answers, JSON error bodies.
// Properties: never crashes; a token that comes out fits in one header line; an error detail
// stays short (it goes into messages).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "registry/auth.h"

extern const char* const kFuzzSeeds[] = {
    R"(Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull")",
    R"(Basic realm="x \"y\"", charset=UTF-8)",
    R"({"token":"abc","access_token":"def","expires_in":300})",
    R"({"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}}]})",
    ""};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  sbx::registry::Challenge c = sbx::registry::ParseChallenge(text);
  if (c.scheme.size() > text.size()) std::abort();
  auto token = sbx::registry::TokenFromAnswer(text);
  if (token.ok() && (token->empty() || token->find_first_of("\r\n ") != std::string::npos)) {
    std::abort();
  }
  if (sbx::registry::RegistryErrorDetail(text).size() > 303) std::abort();
  return 0;
}
