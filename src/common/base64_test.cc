#include "common/base64.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

namespace sbx {
namespace {

TEST(Base64, RoundTripsEveryLength) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); ++n) {
    std::string in = all.substr(0, n);
    EXPECT_EQ(Base64Decode(Base64Encode(in)).value(), in);
    EXPECT_EQ(Base64UrlDecode(Base64UrlEncode(in)).value(), in);
  }
  EXPECT_EQ(Base64Encode("hi\n"), "aGkK");
  EXPECT_EQ(Base64Encode("h"), "aA==");
  EXPECT_FALSE(Base64Decode("a*b=").has_value());
}

// The bit-at-a-time decoder the table-driven one replaced: what "accepts exactly the same
// inputs" is checked against.
std::optional<std::string> ReferenceDecode(std::string_view in) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const size_t v = kAlphabet.find(c);
    if (v == std::string_view::npos) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

TEST(Base64, DecodeMatchesReferenceOnValidAndInvalidInput) {
  std::mt19937 rng(42);
  const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_*\n ";
  std::string reused = "leftover bytes that must be replaced";
  for (int iter = 0; iter < 20000; ++iter) {
    std::string in;
    const size_t n = rng() % 24;
    // Mostly valid alphabet so that long valid prefixes and the tail rules get exercised.
    for (size_t i = 0; i < n; ++i) in.push_back(chars[rng() % (rng() % 8 == 0 ? chars.size() : 64)]);
    if (rng() % 4 == 0) in.append(rng() % 3, '=');
    auto want = ReferenceDecode(in);
    EXPECT_EQ(Base64Decode(in), want) << in;
    EXPECT_EQ(Base64DecodeTo(in, reused), want.has_value()) << in;
    if (want) {
      EXPECT_EQ(reused, *want) << in;
    }
  }
  EXPECT_FALSE(Base64Decode("aGk=K").has_value());  // '=' only at the end
  EXPECT_FALSE(Base64Decode("a").has_value());
  EXPECT_EQ(Base64Decode("aGkK").value(), "hi\n");
  EXPECT_EQ(Base64Decode("aA").value(), "h");
}

TEST(Base64, DecodeToLargeBuffer) {
  std::string in(1 << 20, '\0');
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(i * 7 + (i >> 9));
  std::string out;
  ASSERT_TRUE(Base64DecodeTo(Base64Encode(in), out));
  EXPECT_EQ(out, in);
}

TEST(Base64, EncodeAppendAndUrlVariant) {
  std::string out = "x";
  Base64EncodeAppend("hi\n", out);
  Base64EncodeAppend("", out);
  Base64EncodeAppend("h", out);
  EXPECT_EQ(out, "xaGkKaA==");
  EXPECT_EQ(Base64UrlEncode("\xfb\xff"), "-_8");  // no padding, URL alphabet
  EXPECT_EQ(Base64Encode("\xfb\xff"), "+/8=");
  // Every byte value in every position of a 3-byte group, against the decoder.
  std::string all;
  for (int i = 0; i < 256 * 3; ++i) all.push_back(static_cast<char>(i / 3 + i % 3 * 85));
  EXPECT_EQ(Base64Decode(Base64Encode(all)).value(), all);
}

// Into caller memory: exactly Base64EncodedSize bytes, the same as Base64Encode, and not one
// byte past them (the bytes after are left as they were).
TEST(Base64, EncodeToWritesExactlyItsSize) {
  std::string in;
  for (size_t n = 0; n < 200; ++n) {
    const std::string want = Base64Encode(in);
    ASSERT_EQ(Base64EncodedSize(n), want.size()) << n;
    std::string room(want.size() + 8, '#');
    Base64EncodeTo(in, room.data());
    EXPECT_EQ(room, want + "########") << n;
    in.push_back(static_cast<char>(n * 37 + 11));
  }
}

// The decoder sbx-agent had of its own before it linked this file: Base64DecodePadded must
// accept and reject exactly what it did, since that is what a client's stdin met.
std::optional<std::string> AgentReferenceDecode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      if (in[i + k] == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;
      v[k] = value(in[i + k]);
      if (v[k] < 0) return std::nullopt;
    }
    const uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return out;
}

TEST(Base64, PaddedDecodeMatchesTheAgentsFormerDecoder) {
  std::mt19937 rng(7);
  const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_*\n ";
  for (int iter = 0; iter < 50000; ++iter) {
    std::string in;
    const size_t n = rng() % 17;
    for (size_t i = 0; i < n; ++i) in.push_back(chars[rng() % (rng() % 8 == 0 ? chars.size() : 64)]);
    if (rng() % 3 == 0) in.append(rng() % 5, '=');
    EXPECT_EQ(Base64DecodePadded(in), AgentReferenceDecode(in)) << in;
  }
  for (std::string_view in : {"", "====", "A===", "AB==", "ABC=", "ABCD", "AB=C", "A=B=", "AB",
                              "ABC", "ABCDE===", "ABCD====", " ABC", "AB==ABCD", "aGk=\n"}) {
    EXPECT_EQ(Base64DecodePadded(in), AgentReferenceDecode(in)) << in;
  }
  EXPECT_EQ(Base64DecodePadded("aGkK").value(), "hi\n");
  EXPECT_EQ(Base64DecodePadded("aA==").value(), "h");
  EXPECT_FALSE(Base64DecodePadded("aA").has_value());  // padding required
  for (size_t len = 0; len < 64; ++len) {
    const std::string in(len, '\xa5');
    EXPECT_EQ(Base64DecodePadded(Base64Encode(in)).value(), in);
  }
}

// A character at a time: what the vectorized encoder (inputs of 28 bytes and more, on CPUs with
// AVX2) must agree with.
std::string ReferenceEncode(std::string_view in) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
    if (i + 1 < in.size()) v |= uint32_t{static_cast<uint8_t>(in[i + 1])} << 8;
    if (i + 2 < in.size()) v |= static_cast<uint8_t>(in[i + 2]);
    out.push_back(kAlphabet[v >> 18]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back(i + 2 < in.size() ? kAlphabet[v & 63] : '=');
  }
  return out;
}

TEST(Base64, LongInputsMatchTheReference) {
  std::mt19937 rng(3);
  for (size_t n = 0; n < 400; ++n) {
    std::string in(n, '\0');
    for (char& c : in) c = static_cast<char>(rng());
    const std::string enc = Base64Encode(in);
    ASSERT_EQ(enc, ReferenceEncode(in)) << n;
    std::string prefixed = "ab";
    Base64EncodeAppend(in, prefixed);
    ASSERT_EQ(prefixed, "ab" + enc) << n;
    ASSERT_EQ(Base64Decode(enc), in) << n;
    ASSERT_EQ(Base64Decode(enc), ReferenceDecode(enc)) << n;
  }
  // Every byte value in every position of three 32-character groups and a tail: valid
  // characters decode as the reference says, anything else is refused wherever it sits.
  std::string base(200, '\0');
  for (char& c : base) c = static_cast<char>(rng());
  const std::string enc = Base64Encode(base);
  for (size_t pos = 0; pos < 100; ++pos) {
    for (int b = 0; b < 256; ++b) {
      std::string bad = enc;
      bad[pos] = static_cast<char>(b);
      ASSERT_EQ(Base64Decode(bad), ReferenceDecode(bad)) << pos << " " << b;
    }
  }
}

}  // namespace
}  // namespace sbx
