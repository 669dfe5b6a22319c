#include "service/attach_token.h"

#include <gtest/gtest.h>

namespace sbx::service {
namespace {

TEST(AttachTokens, RoundTripAndScope) {
  AttachTokens tokens("key", std::chrono::seconds(60));
  auto now = std::chrono::system_clock::now();
  auto minted = tokens.MintAt("ses_a", "default", now);
  auto claims = tokens.VerifyAt(minted.token, now);
  ASSERT_TRUE(claims.ok()) << claims.status();
  EXPECT_EQ(claims->session_id, "ses_a");
  EXPECT_EQ(claims->tenant_id, "default");
}

TEST(AttachTokens, RejectsExpiredForgedAndMalformed) {
  AttachTokens tokens("key", std::chrono::seconds(60));
  auto now = std::chrono::system_clock::now();
  auto minted = tokens.MintAt("ses_a", "default", now);
  EXPECT_FALSE(tokens.VerifyAt(minted.token, now + std::chrono::seconds(61)).ok());
  AttachTokens other("other-key", std::chrono::seconds(60));
  EXPECT_FALSE(other.VerifyAt(minted.token, now).ok());
  std::string tampered = minted.token;
  tampered[6] = tampered[6] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(tokens.VerifyAt(tampered, now).ok());
  for (const char* bad : {"", "sat1.", "sat1..", "garbage", "sat1.e30.AAAA"}) {
    auto r = tokens.VerifyAt(bad, now);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

}  // namespace
}  // namespace sbx::service
