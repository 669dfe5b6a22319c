// Fuzz target for the untrusted-JSON helper (src/common/json_util.h) that every API body,
// WebSocket control message and agent frame goes through. Properties: never crashes or
// throws; an accepted text nests at most the limit, exactly as deep as the pre-scan said, and
// survives dump() and a second parse unchanged; valid JSON refused as too deep really is
// deeper than the limit; a text refused otherwise is not JSON at all.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/json_util.h"
#include "deep_json_seeds.h"

namespace {
using sbx::fuzz::DeepArrays;
using sbx::fuzz::DeepObjects;

void Check(bool cond) {
  if (!cond) std::abort();
}

// The depth of a parsed value, with an explicit stack (the thing under test is recursion).
int DepthOf(const nlohmann::json& root) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> stack{{&root, 0}};
  while (!stack.empty()) {
    auto [v, d] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& child : *v) stack.emplace_back(&child, d + 1);
  }
  return deepest;
}

const std::string kSeeds[] = {
    DeepArrays(63, "1"), DeepArrays(64), DeepArrays(65), DeepObjects(64), DeepObjects(65),
    DeepArrays(400000), DeepObjects(150000), sbx::fuzz::DeepResize(),
    sbx::fuzz::BracketsInStrings(), "[" + DeepArrays(70) /* unbalanced */, DeepArrays(1000),
};
}  // namespace

extern const char* const kFuzzSeeds[] = {
    kSeeds[0].c_str(), kSeeds[1].c_str(), kSeeds[2].c_str(), kSeeds[3].c_str(),
    kSeeds[4].c_str(), kSeeds[5].c_str(), kSeeds[6].c_str(), kSeeds[7].c_str(),
    kSeeds[8].c_str(), kSeeds[9].c_str(), kSeeds[10].c_str(),
    R"({"argv":["sh","-c","echo [ok]"],"env":{"A":"{"},"tty":{"rows":24,"cols":80}})",
    R"({"ok":false,"error":{"code":"not_found","message":"no \"x\""}})",
    R"(["\u005b", "\\", "\"", "\ud83d\ude00", 1e5, -0.0, true, null])", "\"\\\"[[[\"", "[]", "{}",
    "", " ", "1", "[1,]", "{} x", "\"\xff\"",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  // The first byte also picks a small limit, so that the edge is crossed often.
  for (int limit : {sbx::kMaxUntrustedJsonDepth, size > 0 ? data[0] % 8 : 0}) {
    auto j = sbx::ParseUntrustedJson(in, limit);
    const int scanned = sbx::JsonNestingDepth(in, limit);
    if (j.ok()) {
      const int depth = DepthOf(*j);
      Check(depth <= limit);
      Check(depth == scanned);
      // What the helper hands out may be walked recursively: dump, parse again, compare.
      const std::string text = j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      auto again = sbx::ParseUntrustedJson(text, limit);
      Check(again.ok() && *again == *j);
      continue;
    }
    Check(j.status().code() == absl::StatusCode::kInvalidArgument);
    if (sbx::IsJsonTooDeep(j.status())) {
      Check(scanned > limit);
      // Valid JSON refused for its depth really is that deep (asking nlohmann's iterative
      // parser directly, and measuring with a loop). Only for small inputs: building the
      // 400,000-level trees for every mutation would take minutes; the 65..1000-level seeds
      // cover the property.
      if (size <= (16u << 10)) {
        auto plain = nlohmann::json::parse(in.begin(), in.end(), nullptr, false);
        if (!plain.is_discarded()) Check(DepthOf(plain) > limit);
      }
    } else {
      // Not refused for depth: then it is not JSON (nlohmann's parser is iterative, so asking
      // it directly is safe here; the depth is within the limit anyway).
      Check(scanned <= limit);
      Check(nlohmann::json::parse(in.begin(), in.end(), nullptr, false).is_discarded());
    }
  }
  return 0;
}
