// Base64 (standard, padded) for output bytes in attach events and stdin, and URL-safe base64
// for tokens. No OpenSSL here (the digests are in digest.h): the static sbx-agent links this.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sbx {

std::string Base64Encode(std::string_view in);
// Appends the standard, padded base64 of `in` to `out`: the attach stream's hot path, which
// builds a whole SSE event in one buffer.
void Base64EncodeAppend(std::string_view in, std::string& out);
// The same into memory the caller provides, exactly Base64EncodedSize(in.size()) bytes at
// `out`: for a buffer that does not zero what it grows into (common/byte_buffer.h).
size_t Base64EncodedSize(size_t n);
void Base64EncodeTo(std::string_view in, char* out);
// Padding is optional: trailing '=' are ignored.
std::optional<std::string> Base64Decode(std::string_view in);
// Decodes standard base64 into `out` (replacing its contents, reusing its capacity): the hot
// path of stream readers. Accepts exactly what Base64Decode accepts; false on bad input.
bool Base64DecodeTo(std::string_view in, std::string& out);
// Standard base64 with its padding required, as sbxd writes it: a length that is a multiple of
// 4, at most two '=' and only at the end. What the agent accepts for stdin's data_b64.
std::optional<std::string> Base64DecodePadded(std::string_view in);
std::string Base64UrlEncode(std::string_view in);  // no padding
std::optional<std::string> Base64UrlDecode(std::string_view in);

}  // namespace sbx
