// Fuzz target for image references (src/registry/registry.h ParseReference), which clients
// send in POST /v1/templates. Properties: never crashes; what parses prints back (String())
// as a reference that parses to the same parts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "registry/registry.h"

extern const char* const kFuzzSeeds[] = {
    "busybox", "127.0.0.1:5000/team/app:1.2", "localhost/x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "docker.io/library/python:3.12", ""};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto r = sbx::registry::ParseReference(text);
  if (!r.ok()) return 0;
  auto again = sbx::registry::ParseReference(r->String());
  if (!again.ok() || again->registry != r->registry || again->repository != r->repository ||
      again->tag != r->tag || again->digest != r->digest) {
    std::abort();
  }
  return 0;
}
