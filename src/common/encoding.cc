#include "common/encoding.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <array>
#include <cstdint>

namespace sbx {
namespace {
constexpr char kStd[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr char kUrl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string Encode(std::string_view in, const char* alphabet, bool pad) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(alphabet[(v >> 6) & 63]);
    out.push_back(alphabet[v & 63]);
  }
  size_t rest = in.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{p[i]} << 16;
    if (rest == 2) v |= uint32_t{p[i + 1]} << 8;
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    if (rest == 2) out.push_back(alphabet[(v >> 6) & 63]);
    if (pad) out.append(rest == 1 ? "==" : "=");
  }
  return out;
}

using DecodeTable = std::array<int8_t, 256>;

constexpr DecodeTable MakeDecodeTable(const char* alphabet) {
  DecodeTable rev{};
  for (auto& v : rev) v = -1;
  for (int i = 0; i < 64; ++i) rev[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
  return rev;
}
constexpr DecodeTable kStdRev = MakeDecodeTable(kStd);
constexpr DecodeTable kUrlRev = MakeDecodeTable(kUrl);

// Trailing '=' are all stripped (padding is optional), a length of 4k+1 cannot come from any
// input, and the bits left over in the last group are ignored.
bool DecodeTo(std::string_view in, const DecodeTable& rev, std::string& out) {
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return false;
  out.resize(in.size() / 4 * 3 + (in.size() % 4 == 0 ? 0 : in.size() % 4 - 1));
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  auto* o = reinterpret_cast<uint8_t*>(out.data());
  const size_t full = in.size() / 4 * 4;
  // One OR of the four table values per group catches any invalid byte (-1 has the sign bit),
  // so the loop has a single, well-predicted branch.
  for (size_t i = 0; i < full; i += 4, o += 3) {
    const int32_t a = rev[p[i]], b = rev[p[i + 1]], c = rev[p[i + 2]], d = rev[p[i + 3]];
    if ((a | b | c | d) < 0) return false;
    const uint32_t v = (uint32_t(a) << 18) | (uint32_t(b) << 12) | (uint32_t(c) << 6) | uint32_t(d);
    o[0] = static_cast<uint8_t>(v >> 16);
    o[1] = static_cast<uint8_t>(v >> 8);
    o[2] = static_cast<uint8_t>(v);
  }
  const size_t rest = in.size() - full;
  if (rest > 0) {
    const int32_t a = rev[p[full]], b = rev[p[full + 1]];
    const int32_t c = rest == 3 ? rev[p[full + 2]] : 0;
    if ((a | b | c) < 0) return false;
    const uint32_t v = (uint32_t(a) << 18) | (uint32_t(b) << 12) | (uint32_t(c) << 6);
    o[0] = static_cast<uint8_t>(v >> 16);
    if (rest == 3) o[1] = static_cast<uint8_t>(v >> 8);
  }
  return true;
}

std::optional<std::string> Decode(std::string_view in, const DecodeTable& rev) {
  std::string out;
  if (!DecodeTo(in, rev, out)) return std::nullopt;
  return out;
}
}  // namespace

std::string Base64Encode(std::string_view in) { return Encode(in, kStd, true); }
std::optional<std::string> Base64Decode(std::string_view in) { return Decode(in, kStdRev); }
bool Base64DecodeTo(std::string_view in, std::string& out) { return DecodeTo(in, kStdRev, out); }
std::string Base64UrlEncode(std::string_view in) { return Encode(in, kUrl, false); }
std::optional<std::string> Base64UrlDecode(std::string_view in) { return Decode(in, kUrlRev); }

std::string Sha256Hex(std::string_view in) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(in.data()), in.size(), md);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof(md));
  for (unsigned char c : md) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string HmacSha256(std::string_view key, std::string_view msg) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &len);
  return std::string(reinterpret_cast<char*>(md), len);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace sbx
