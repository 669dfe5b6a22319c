#include "api/target.h"

#include <gtest/gtest.h>

namespace sbx::api {
namespace {

TEST(ParseTarget, PathAndQuery) {
  auto t = ParseTarget("/v1/sandboxes?state=running&label=team%3Dx&limit=5&flag");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->segments, (std::vector<std::string>{"v1", "sandboxes"}));
  EXPECT_EQ(*t->Query("label"), "team=x");
  EXPECT_EQ(*t->Query("limit"), "5");
  EXPECT_EQ(*t->Query("flag"), "");
  EXPECT_FALSE(t->Query("nope").has_value());
}

TEST(ParseTarget, Rejects) {
  EXPECT_FALSE(ParseTarget("").ok());
  EXPECT_FALSE(ParseTarget("v1").ok());
  EXPECT_FALSE(ParseTarget("/v1/%zz").ok());
  EXPECT_FALSE(ParseTarget("/v1/%2").ok());
  EXPECT_FALSE(ParseTarget("/v1/a%00b").ok());
  EXPECT_FALSE(ParseTarget("/v1?x=%").ok());
}

TEST(ParseTarget, EmptySegmentsCollapse) {
  auto t = ParseTarget("//v1///sessions/ses_x/attach/");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->segments, (std::vector<std::string>{"v1", "sessions", "ses_x", "attach"}));
}

TEST(SseEvent, WireFormat) {
  EXPECT_EQ(SseEvent(7, "stdout", R"({"data_b64":"aGkK","offset":0})"),
            "id: 7\nevent: stdout\ndata: {\"data_b64\":\"aGkK\",\"offset\":0}\n\n");
  EXPECT_EQ(SseEvent(0, "error", "{}"), "event: error\ndata: {}\n\n");
}

}  // namespace
}  // namespace sbx::api
