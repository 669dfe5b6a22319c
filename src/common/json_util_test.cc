#include "common/json_util.h"

#include <gtest/gtest.h>

#include <string>

namespace sbx {
namespace {

std::string Nested(int levels, const std::string& inner = "") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

std::string NestedObjects(int levels) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(levels, '}');
  return s;
}

TEST(JsonNestingDepth, CountsBracketsOutsideStrings) {
  EXPECT_EQ(JsonNestingDepth("1", 64), 0);
  EXPECT_EQ(JsonNestingDepth("\"[[[{{{\"", 64), 0);
  EXPECT_EQ(JsonNestingDepth("[]", 64), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a":[1]})", 64), 2);
  EXPECT_EQ(JsonNestingDepth(R"([[1],[2],[[3]]])", 64), 3);
  // Escaped quotes and backslashes do not end the string early.
  EXPECT_EQ(JsonNestingDepth(R"(["\"[[[", "\\", "\\\"{{"])", 64), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"k\u005b":"]]]"})", 64), 1);
}

TEST(JsonNestingDepth, StopsCountingPastTheLimit) {
  EXPECT_EQ(JsonNestingDepth(Nested(1000), 10), 11);
}

TEST(JsonNestingDepth, UnbalancedTextIsAnUpperBound) {
  EXPECT_EQ(JsonNestingDepth("]]]][[", 64), 2);
  EXPECT_EQ(JsonNestingDepth("[[[", 64), 3);
}

TEST(ParseUntrustedJson, AcceptsTheLimit) {
  auto j = ParseUntrustedJson(Nested(64, "7"), 64);
  ASSERT_TRUE(j.ok()) << j.status();
  const nlohmann::json* v = &*j;
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(v->is_array());
    v = &(*v)[0];
  }
  EXPECT_EQ(*v, 7);
  auto o = ParseUntrustedJson(NestedObjects(64));
  ASSERT_TRUE(o.ok()) << o.status();
}

TEST(ParseUntrustedJson, RefusesOneLevelMore) {
  for (const std::string& text : {Nested(65), NestedObjects(65)}) {
    auto j = ParseUntrustedJson(text, 64);
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(IsJsonTooDeep(j.status())) << j.status();
    EXPECT_NE(std::string(j.status().message()).find("deeper than 64"), std::string::npos);
  }
}

TEST(ParseUntrustedJson, RefusesTheAttackWithoutCrashing) {
  // Issue 13's message: 400,000 levels inside an otherwise valid control message.
  const std::string text =
      R"({"type":"resize","cols":10,"rows":)" + Nested(400000) + "}";
  auto j = ParseUntrustedJson(text);
  ASSERT_FALSE(j.ok());
  EXPECT_TRUE(IsJsonTooDeep(j.status()));
  // And as objects, and unterminated (the parser is never reached).
  EXPECT_TRUE(IsJsonTooDeep(ParseUntrustedJson(NestedObjects(400000)).status()));
  EXPECT_TRUE(IsJsonTooDeep(ParseUntrustedJson(std::string(400000, '[')).status()));
}

TEST(ParseUntrustedJson, BracketsInsideStringsAreNotNesting) {
  const std::string deep_text(100000, '[');
  auto j = ParseUntrustedJson(R"({"data":")" + deep_text + R"(\"", "x":"}}}]]]"})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["data"].get<std::string>(), deep_text + "\"");
}

TEST(ParseUntrustedJson, InvalidJsonIsNotTooDeep) {
  for (std::string_view text : {"", "{", "[1,]", "{} x", "\"\xff\"", "1e400", "nul"}) {
    auto j = ParseUntrustedJson(text);
    ASSERT_FALSE(j.ok()) << text;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(IsJsonTooDeep(j.status())) << text;
  }
  // A string that is never closed hides its brackets: invalid, not deep.
  auto j = ParseUntrustedJson("[\"" + Nested(1000));
  ASSERT_FALSE(j.ok());
  EXPECT_FALSE(IsJsonTooDeep(j.status()));
}

}  // namespace
}  // namespace sbx
