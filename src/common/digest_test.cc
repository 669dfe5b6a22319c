#include "common/digest.h"

#include <gtest/gtest.h>

namespace sbx {
namespace {

TEST(Crypto, HmacAndCompare) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_EQ(HmacSha256("k", "m").size(), 32u);
}

}  // namespace
}  // namespace sbx
