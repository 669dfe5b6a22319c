// Base64 (standard, padded) for output bytes in attach events, and URL-safe base64 for tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sbx {

std::string Base64Encode(std::string_view in);
std::optional<std::string> Base64Decode(std::string_view in);
std::string Base64UrlEncode(std::string_view in);  // no padding
std::optional<std::string> Base64UrlDecode(std::string_view in);

// Lowercase hex SHA-256 of `in`.
std::string Sha256Hex(std::string_view in);
// Raw HMAC-SHA256(key, msg).
std::string HmacSha256(std::string_view key, std::string_view msg);
// Constant-time comparison for secrets.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sbx
