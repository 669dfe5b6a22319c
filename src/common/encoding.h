// Base64 (standard, padded) for output bytes in attach events, and URL-safe base64 for tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sbx {

std::string Base64Encode(std::string_view in);
// Appends the standard, padded base64 of `in` to `out`: the attach stream's hot path, which
// builds a whole SSE event in one buffer.
void Base64EncodeAppend(std::string_view in, std::string& out);
std::optional<std::string> Base64Decode(std::string_view in);
// Decodes standard base64 into `out` (replacing its contents, reusing its capacity): the hot
// path of stream readers. Accepts exactly what Base64Decode accepts; false on bad input.
bool Base64DecodeTo(std::string_view in, std::string& out);
std::string Base64UrlEncode(std::string_view in);  // no padding
std::optional<std::string> Base64UrlDecode(std::string_view in);

// Lowercase hex SHA-256 of `in`.
std::string Sha256Hex(std::string_view in);
// Raw HMAC-SHA256(key, msg).
std::string HmacSha256(std::string_view key, std::string_view msg);
// Constant-time comparison for secrets.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sbx
