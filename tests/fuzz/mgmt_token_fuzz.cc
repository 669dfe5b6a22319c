// Fuzz target for management tokens (src/service/mgmt_token.h): the bearer token of an
// unauthenticated client, and the "scopes" list of a token request (the input split at ',').
// Properties: never crashes or throws; a refused token is Unauthenticated and its message
// repeats none of the input; an accepted token has exactly the documented shape and yields a
// valid token id; a refused scope list is InvalidArgument with a bounded, printable message;
// an accepted one formats and parses back to the same bits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "common/ids.h"
#include "common/status_util.h"
#include "service/mgmt_token.h"

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}

using sbx::service::ParseScopes;
using sbx::service::ParseToken;
using sbx::service::Scopes;

const std::regex& ScannerRegex() {
  static const std::regex re("sbxm1_[a-z2-7]{20}_[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]");
  return re;
}

bool Printable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

void FuzzToken(const std::string& in) {
  auto r = ParseToken(in);
  if (!r.ok()) {
    Check(r.status().code() == absl::StatusCode::kUnauthenticated);
    Check(sbx::ApiErrorCode(r.status()) == "unauthenticated");
    const std::string m(r.status().message());
    Check(Printable(m) && m.size() < 128);
    if (in.size() >= 8) Check(m.find(in) == std::string::npos);
    return;
  }
  Check(in.size() == sbx::service::kMgmtTokenBytes);
  Check(std::regex_match(in, ScannerRegex()));
  Check(sbx::IsValidId(r->id, "tok"));
  Check(r->token == in);
  Check(in.compare(6, 20, r->id, 4, 20) == 0);
  Check(sbx::service::TokenMatches(in, sbx::service::HashToken(in)));
}

void FuzzScopes(const std::string& in) {
  std::vector<std::string> names;
  size_t from = 0;
  while (true) {
    const size_t comma = in.find(',', from);
    names.push_back(in.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  if (in.empty()) names.clear();
  auto r = ParseScopes(names);
  if (!r.ok()) {
    Check(r.status().code() == absl::StatusCode::kInvalidArgument);
    Check(sbx::ApiErrorCode(r.status()) == "invalid_argument");
    const std::string m(r.status().message());
    Check(Printable(m) && m.size() < 256);
    return;
  }
  const Scopes v = *r;
  Check(v != 0 && (v & ~sbx::service::kAllScopes) == 0);
  auto back = ParseScopes(sbx::service::ScopeNames(v));
  Check(back.ok() && *back == v);
  for (const std::string& n : names) {
    bool named = false;
    for (const std::string& s : sbx::service::ScopeNames(v)) named = named || s == n;
    Check(named);
  }
}
}  // namespace

extern const char* const kFuzzSeeds[] = {
    "sbxm1_abcdefghijklmnopqr27_AZaz09-_AZaz09-_AZaz09-_AZaz09-_AZaz09-_AZQ",
    "sbxm1_aaaaaaaaaaaaaaaaaaaa___________________________________________w",
    "sbxm1_zzzzzzzzzzzzzzzzzzzz_------------------------------------------8",
    "sbxm1_abcdefghijklmnopqr27__Zaz09-_AZaz09-_AZaz09-_AZaz09-_AZaz09-_AZQ",
    "sbxm1_", "sbxm1__", "tok_abcdefghijklmnopqr27", "Bearer sbxm1_",
    "read", "read,sandboxes,sessions,files,templates,admin", "admin", "read,,read", ",", "READ",
    "templates,files", "sandbox", "",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  FuzzToken(in);
  FuzzScopes(in);
  return 0;
}
