// Fuzz target for attach tokens (src/service/attach_token.h): the query parameter or bearer
// token of an unauthenticated client, and, behind the signature, the claims JSON, in both
// formats (sat2 names its key, legacy sat1 does not). Properties: never crashes or throws;
// every failure is Unauthenticated; a token whose claims are the input, correctly signed, is
// accepted only unexpired; a token naming a key the ring lacks is refused; a minted token
// verifies to the claims it was minted with.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/base64.h"
#include "common/digest.h"
#include "deep_json_seeds.h"
#include "service/attach_token.h"

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}

const std::string kKey(32, 'k');
const std::string kSeeds[] = {
    // Claims at and past the depth limit, as a signed token would carry them (the token's
    // 1 KiB limit keeps the deepest ones out before the parser).
    R"({"sid":)" + sbx::fuzz::DeepArrays(64) + R"(,"ten":"t","exp":4102444800})",
    R"({"sid":"s","ten":"t","exp":4102444800,"x":)" + sbx::fuzz::DeepArrays(300) + "}",
    sbx::fuzz::DeepArrays(400000),
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kSeeds[0].c_str(), kSeeds[1].c_str(), kSeeds[2].c_str(),
    R"({"sid":"ses_aaaaaaaaaaaaaaaaaaaa","ten":"default","exp":4102444800})",
    R"({"sid":"ses_a","ten":"default","exp":1})", R"({"sid":1,"ten":"t","exp":"x"})",
    "sat1.eyJzaWQiOiJzIn0.AAAA", "sat1..", "sat1.", ".", "", "[]",
    "sat2.0123abcd.eyJzaWQiOiJzIn0.AAAA", "sat2...", "sat2.", "sat2.x.", "sat2..e30.AAAA",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  static const sbx::service::AttachTokens tokens(kKey, std::chrono::seconds(3600));
  static const std::string kid = sbx::service::AttachTokens::KeyId(kKey);
  const auto now = std::chrono::system_clock::time_point(std::chrono::seconds(1700000000));

  // As a token, straight from the client.
  auto raw = tokens.VerifyAt(in, now);
  if (!raw.ok()) Check(raw.status().code() == absl::StatusCode::kUnauthenticated);

  // As the claims of a token signed with the right key, in either format: reaches the JSON
  // parser.
  for (const std::string& body :
       {"sat1." + sbx::Base64UrlEncode(in), "sat2." + kid + "." + sbx::Base64UrlEncode(in)}) {
    const std::string token = body + "." + sbx::Base64UrlEncode(sbx::HmacSha256(kKey, body));
    auto signed_claims = tokens.VerifyAt(token, now);
    if (!signed_claims.ok()) {
      Check(signed_claims.status().code() == absl::StatusCode::kUnauthenticated);
    } else {
      Check(token.size() <= 1024 && signed_claims->expires_unix > 1700000000);
    }
  }

  // As the kid of a correctly signed token: accepted only when it is the ring's key's id.
  {
    const std::string body = "sat2." + in + ".eyJzaWQiOiJzIiwidGVuIjoidCIsImV4cCI6NDEwMjQ0NDgwMH0";
    const std::string token = body + "." + sbx::Base64UrlEncode(sbx::HmacSha256(kKey, body));
    auto named = tokens.VerifyAt(token, now);
    if (!named.ok()) Check(named.status().code() == absl::StatusCode::kUnauthenticated);
    Check(named.ok() == (in == kid));
  }

  // Minted for ids made from the input (sbxd's ids are ASCII): verifies to the same claims
  // when it fits in a token, and is refused when it does not.
  const std::string id = sbx::Base64UrlEncode(in).substr(0, 600);
  auto minted = tokens.MintAt(id, "tenant", now);
  auto back = tokens.VerifyAt(minted.token, now);
  if (minted.token.size() <= 1024) {
    Check(back.ok() && back->session_id == id && back->tenant_id == "tenant");
  } else {
    Check(!back.ok());
  }
  return 0;
}
