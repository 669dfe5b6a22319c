#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "common/time_util.h"
#include "common/encoding.h"
#include "common/ids.h"
#include "common/status_util.h"

namespace sbx {
namespace {

TEST(Ids, ShapeAndValidation) {
  std::string id = NewId("sbx");
  EXPECT_TRUE(IsValidId(id, "sbx")) << id;
  EXPECT_FALSE(IsValidId(id, "op"));
  EXPECT_FALSE(IsValidId("sbx_../../etc/passwd", "sbx"));
  EXPECT_FALSE(IsValidId("sbx_", "sbx"));
  EXPECT_NE(NewId("sbx"), NewId("sbx"));
}

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

TEST(Errno, MapsToCanonicalCodes) {
  auto s = ErrnoStatus(ENOENT, "open template: open(/x)");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(s.message()).find("open template: open(/x)"), std::string::npos);
  EXPECT_NE(std::string(s.message()).find("errno 2"), std::string::npos);
}

TEST(Crypto, HmacAndCompare) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_EQ(HmacSha256("k", "m").size(), 32u);
}

}  // namespace
}  // namespace sbx

namespace sbx {
namespace {

TEST(TimeUtilTest, ParseRfc3339InvertsFormat) {
  using std::chrono::system_clock;
  const auto t = system_clock::time_point(std::chrono::milliseconds(1796017886123));
  const std::string s = FormatRfc3339(t);
  EXPECT_EQ(s, "2026-11-30T05:51:26.123Z");
  auto back = ParseRfc3339(s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, t);
  for (const char* bad : {"", "2026-11-30T05:51:26Z", "2026-11-30T05:51:26.123+01:00",
                          "2026-13-30T05:51:26.123Z", "2026-11-30T05:51:26.123Zx",
                          "2026-11-30 05:51:26.123Z", "garbage garbage garbage!"}) {
    EXPECT_FALSE(ParseRfc3339(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace sbx
