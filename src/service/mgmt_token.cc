#include "service/mgmt_token.h"

#include <array>

#include <fmt/format.h>

#include "common/digest.h"
#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::service {
namespace {

constexpr size_t kIdChars = 20;
constexpr size_t kSecretChars = 43;
constexpr size_t kIdAt = kMgmtTokenPrefix.size();
constexpr size_t kSeparatorAt = kIdAt + kIdChars;
constexpr size_t kSecretAt = kSeparatorAt + 1;
static_assert(kSecretAt + kSecretChars == kMgmtTokenBytes);
static_assert(kMgmtTokenBytes <= kMgmtTokenMaxBytes);

// Only static text: the input may be a real token sent to the wrong place, and this message
// ends up in logs and responses.
absl::Status Malformed(const char* why) {
  return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                  fmt::format("management token is malformed: {}", why));
}

bool IsBase32(char c) { return (c >= 'a' && c <= 'z') || (c >= '2' && c <= '7'); }

bool IsBase64Url(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '_';
}

// The last of 43 characters carries the last 4 bits of 32 bytes and 2 zero bits: its value in
// the base64url alphabet is a multiple of 4. Anything else did not come from NewSecret(32).
bool IsCanonicalLast(char c) {
  return std::string_view("AEIMQUYcgkosw048").find(c) != std::string_view::npos;
}

constexpr std::array<std::pair<Scope, std::string_view>, 6> kScopeNames = {{
    {Scope::kRead, "read"},
    {Scope::kSandboxes, "sandboxes"},
    {Scope::kSessions, "sessions"},
    {Scope::kFiles, "files"},
    {Scope::kTemplates, "templates"},
    {Scope::kAdmin, "admin"},
}};

std::string ValidScopeList() {
  std::string out;
  for (const auto& [scope, name] : kScopeNames) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// A client's string inside our message: bounded, and nothing that could break a log line.
std::string Printable(std::string_view s) {
  constexpr size_t kMax = 64;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const char c = s[i];
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  if (s.size() > kMax) out += "...";
  return out;
}

absl::Status ScopeError(std::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument", message, "scopes");
}

}  // namespace

MintedToken MintToken() {
  MintedToken m;
  m.id = NewId(kMgmtTokenIdPrefix);
  const std::string secret = NewSecret(32);
  m.token.reserve(kMgmtTokenBytes);
  m.token.append(kMgmtTokenPrefix);
  m.token.append(std::string_view(m.id).substr(kMgmtTokenIdPrefix.size() + 1));
  m.token.push_back('_');
  m.token.append(secret);
  m.hash = HashToken(m.token);
  return m;
}

absl::StatusOr<ParsedToken> ParseToken(std::string_view token) {
  if (token.size() > kMgmtTokenMaxBytes) return Malformed("too long");
  if (token.substr(0, kMgmtTokenPrefix.size()) != kMgmtTokenPrefix) {
    return Malformed("it does not start with sbxm1_");
  }
  if (token.size() != kMgmtTokenBytes) return Malformed("wrong length");
  const std::string_view id = token.substr(kIdAt, kIdChars);
  for (char c : id) {
    if (!IsBase32(c)) return Malformed("the id is not 20 lowercase base32 characters");
  }
  if (token[kSeparatorAt] != '_') return Malformed("no '_' after the id");
  const std::string_view secret = token.substr(kSecretAt);
  for (char c : secret) {
    if (!IsBase64Url(c)) return Malformed("the secret is not 43 base64url characters");
  }
  if (!IsCanonicalLast(secret.back())) return Malformed("the secret is not 32 bytes");
  ParsedToken p;
  p.id = fmt::format("{}_{}", kMgmtTokenIdPrefix, id);
  p.token = std::string(token);
  return p;
}

std::string HashToken(std::string_view token) { return Sha256Digest(token); }

bool TokenMatches(std::string_view token, std::string_view stored_hash) {
  // The length of a hash is public; ConstantTimeEquals returns early only on that.
  return ConstantTimeEquals(HashToken(token), stored_hash);
}

std::string_view ScopeName(Scope s) {
  for (const auto& [scope, name] : kScopeNames) {
    if (scope == s) return name;
  }
  return {};
}

absl::StatusOr<Scopes> ParseScopes(const std::vector<std::string>& names) {
  if (names.empty()) {
    return ScopeError(fmt::format("scopes: at least one is needed (valid: {})", ValidScopeList()));
  }
  Scopes out = 0;
  for (const std::string& n : names) {
    Scopes bit = 0;
    for (const auto& [scope, name] : kScopeNames) {
      if (name == n) bit = ScopeBit(scope);
    }
    if (bit == 0) {
      return ScopeError(fmt::format("scopes: unknown scope \"{}\" (valid: {})", Printable(n),
                                    ValidScopeList()));
    }
    out |= bit;
  }
  return out;
}

std::vector<std::string> ScopeNames(Scopes scopes) {
  std::vector<std::string> out;
  for (const auto& [scope, name] : kScopeNames) {
    if (scopes & ScopeBit(scope)) out.emplace_back(name);
  }
  return out;
}

bool HasScope(Scopes have, Scope need) {
  return (have & (ScopeBit(need) | ScopeBit(Scope::kAdmin))) != 0;
}

}  // namespace sbx::service
