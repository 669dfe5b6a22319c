#include <gtest/gtest.h>

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
