#include "common/status_util.h"

#include <gtest/gtest.h>

namespace sbx {
namespace {

// Context added on the way up must keep what decides the HTTP answer: an annotated
// bad_agent_reply once became a bare kInternal, a 500 instead of a 502.
TEST(Annotate, KeepsTheApiCodeFieldAndDetails) {
  absl::Status s = WithDetail(
      ApiError(absl::StatusCode::kInternal, "bad_agent_reply", "a frame too big", "body"),
      "limit", "4194304");
  absl::Status a = Annotate(Annotate(s, "agent protocol"), "processes of s1");
  EXPECT_EQ(a.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(std::string(a.message()), "processes of s1: agent protocol: a frame too big");
  EXPECT_EQ(ApiErrorCode(a), "bad_agent_reply");
  EXPECT_EQ(ApiErrorField(a), "body");
  EXPECT_EQ(ApiErrorDetail(a, "limit"), "4194304");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace sbx
