// Management tokens (issue 18, tenancy): the bearer credentials of the management API, one
// per tenant client, each with its own scopes, revocable one by one. Unlike attach tokens
// (attach_token.h) they carry no claims: the token names a row in the store by its id, and the
// row holds the tenant, the scopes and the SHA-256 of the whole token. sbxd never stores the
// token itself, so a leaked store (or backup) cannot be replayed against the API.
//
// Format, 70 bytes:
//
//   sbxm1_<id>_<secret>
//     sbxm1_  version 1 of the format; the fixed prefix lets secret scanners find leaked tokens
//     <id>    the 20 lowercase base32 characters of the token id "tok_<id>" (common/ids.h)
//     <secret> NewSecret(32): 32 random bytes, URL-safe base64 without padding, 43 characters
//
// The secret's alphabet includes '_' and '-', so '_' is not a separator past the id: parsing is
// by position. 32 bytes end in a group of 2 (10 * 3 + 2), encoded as 3 characters of 18 bits,
// so the last character holds 4 data bits and 2 zero bits: it is one of AEIMQUYcgkosw048.
// Regex for secret scanners (add boundaries as the scanner's syntax wants them; GitHub's
// custom patterns do by default):
//
//   sbxm1_[a-z2-7]{20}_[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]
//
// Checking a presented token: ParseToken (shape only, no I/O) -> look the id up in the store
// -> TokenMatches(token, row.hash). A plain SHA-256 rather than a slow password hash is enough
// because the secret is 256 random bits: there is nothing to brute-force, and the check stays
// a few microseconds on every request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::service {

inline constexpr std::string_view kMgmtTokenPrefix = "sbxm1_";
inline constexpr std::string_view kMgmtTokenIdPrefix = "tok";  // ids are "tok_<20 base32>"
inline constexpr size_t kMgmtTokenBytes = 70;
// Anything longer is refused before it is looked at (a header can be kilobytes).
inline constexpr size_t kMgmtTokenMaxBytes = 128;

struct MintedToken {
  std::string id;     // "tok_<20 base32>", the store's key
  std::string token;  // shown to the client once, never stored
  std::string hash;   // HashToken(token), what the store keeps
};

// A fresh token from the OS's CSPRNG (OpenSSL RAND_bytes, which aborts rather than return
// weak bytes).
MintedToken MintToken();

struct ParsedToken {
  std::string id;     // "tok_<20 base32>"
  std::string token;  // the whole token, for TokenMatches
};

// Checks the shape exactly (prefix, id alphabet, secret alphabet and length, the secret's last
// character). Unauthenticated with API code "unauthenticated" on anything else; the message
// says what is wrong but never repeats any of the input, so it is safe to log and to return.
absl::StatusOr<ParsedToken> ParseToken(std::string_view token);

// "sha256:<64 lowercase hex>" of the whole token.
std::string HashToken(std::string_view token);

// True when `token` hashes to `stored_hash`, compared in constant time so that the response
// time says nothing about how much of a guessed hash matched.
bool TokenMatches(std::string_view token, std::string_view stored_hash);

// Scopes of a management token, as bits so that a token's scopes are one integer column.
// The values are stored: never renumber, only add.
enum class Scope : uint32_t {
  kRead = 1u << 0,       // "read": GET of everything the tenant owns
  kSandboxes = 1u << 1,  // "sandboxes": create, change and delete sandboxes
  kSessions = 1u << 2,   // "sessions": exec, attach, stdin, signals
  kFiles = 1u << 3,      // "files": read and write files in sandboxes
  kTemplates = 1u << 4,  // "templates": import, pull, build and delete templates
  kAdmin = 1u << 5,      // "admin": everything, including managing tokens (HasScope)
};
using Scopes = uint32_t;

constexpr Scopes ScopeBit(Scope s) { return static_cast<Scopes>(s); }
inline constexpr Scopes kAllScopes =
    ScopeBit(Scope::kRead) | ScopeBit(Scope::kSandboxes) | ScopeBit(Scope::kSessions) |
    ScopeBit(Scope::kFiles) | ScopeBit(Scope::kTemplates) | ScopeBit(Scope::kAdmin);

// "read", "sandboxes", "sessions", "files", "templates", "admin"; "" for a value outside the
// enum.
std::string_view ScopeName(Scope s);

// The names of a request's "scopes" list, OR-ed together; duplicates are harmless. An empty
// list or an unknown name is InvalidArgument with API code "invalid_argument" and field
// "scopes"; the message names the offending scope (cut to 64 printable characters) and lists
// the valid ones.
absl::StatusOr<Scopes> ParseScopes(const std::vector<std::string>& names);

// The names of the bits set in `scopes`, in the order of the enum (stable for API output and
// tests); bits outside kAllScopes are ignored. Admin is listed as itself, not expanded.
std::vector<std::string> ScopeNames(Scopes scopes);

// True when `have` grants `need`: the bit itself, or kAdmin, which implies every scope.
bool HasScope(Scopes have, Scope need);

}  // namespace sbx::service
