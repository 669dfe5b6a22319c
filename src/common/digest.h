// Digests and secret comparison, on OpenSSL (which the static sbx-agent does not link).
#pragma once

#include <string>
#include <string_view>

namespace sbx {

// Lowercase hex SHA-256 of `in`.
std::string Sha256Hex(std::string_view in);
// Raw HMAC-SHA256(key, msg).
std::string HmacSha256(std::string_view key, std::string_view msg);
// Constant-time comparison for secrets.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sbx
