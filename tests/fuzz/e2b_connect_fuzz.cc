// Fuzz target for the E2B adapter's decoders of untrusted bytes (src/api/e2b/connect.h,
// e2b.h TranslateCreate): Connect stream envelopes, unary JSON messages, proto3-JSON scalars
// and the create body of the control plane. Properties: never crashes or throws; an accepted
// stream request is exactly one uncompressed envelope whose length matches; what is accepted
// is a JSON object; re-enveloping an accepted message parses back to the same message; a
// translated create has a template.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "api/e2b/connect.h"
#include "api/e2b/e2b.h"

extern const char* const kFuzzSeeds[] = {
    "{\"process\":{\"cmd\":\"/bin/bash\",\"args\":[\"-l\",\"-c\",\"echo hi\"]},\"stdin\":false}",
    "\x01\x01\x01\x01\x02{}",
    "\x02\x7f\xff\xff\xff{}",
    "{\"path\":\"/tmp\",\"depth\":1}",
    "{\"templateID\":\"base\",\"metadata\":{\"a\":\"b\"},\"timeout\":120,\"envVars\":{\"X\":\"1\"}}",
    "{\"templateID\":\"base\",\"network\":{\"allowOut\":[\"1.1.1.1\"]}}",
    "{\"process\":{\"pid\":\"7\"},\"input\":{\"stdin\":\"aGk=\"}}",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace e2b = sbx::api::e2b;
  const std::string in(reinterpret_cast<const char*>(data), size);
  auto stream = e2b::ParseStreamRequest(in);
  if (stream.ok()) {
    Check(stream->is_object());
    Check(size >= 5 && data[0] == 0);
    auto again = e2b::ParseStreamRequest(e2b::MessageEnvelope(*stream));
    Check(again.ok() && *again == *stream);
  }
  // Seeds are C strings (no NUL): the input also goes in as the message of a well-formed
  // envelope, and the envelope's header bytes are mutated in place.
  for (uint8_t flags : {uint8_t{0}, uint8_t{1}, uint8_t{2}}) {
    std::string env = e2b::Envelope(flags, in);
    auto m = e2b::ParseStreamRequest(env);
    if (flags != 0) Check(!m.ok());
    if (m.ok()) Check(m->is_object());
    if (!env.empty() && size > 0) {
      env[1 + data[0] % 4] = static_cast<char>(data[size - 1]);
      (void)e2b::ParseStreamRequest(env);
    }
  }
  auto unary = e2b::ParseUnaryRequest(in);
  if (unary.ok()) {
    Check(unary->is_object());
    for (const auto& [k, v] : unary->items()) {
      (void)e2b::JsonInt(v);
      (void)e2b::JsonBytes(v);
      (void)e2b::Field(v, "pid", "pid");
    }
    const nlohmann::json profiles = {{"egress_profiles", {{{"name", "open"}}}}};
    auto created = e2b::TranslateCreate(*unary, profiles);
    if (created.ok()) Check(created->contains("template") && (*created)["template"].is_string());
  }
  return 0;
}
