#include "agent/bounded.h"

#include <string>

#include <gtest/gtest.h>

namespace sbx::agent {
namespace {

using protocol::Json;

TEST(CutField, KeepsShortStringsAndNeverSplitsAUtf8Sequence) {
  EXPECT_EQ(CutField("abc", 8), "abc");
  EXPECT_EQ(CutField("abcdef", 3), "abc");
  const std::string euro = "\xe2\x82\xac";  // 3 bytes
  EXPECT_EQ(CutField("a" + euro, 2), "a");
  EXPECT_EQ(CutField("a" + euro, 3), "a");
  EXPECT_EQ(CutField("a" + euro, 4), "a" + euro);
  // Not UTF-8 at all: cut where the bound says.
  EXPECT_EQ(CutField(std::string(10, '\x80'), 4), std::string(4, '\x80'));
}

TEST(ListReply, BuildsValidJsonAndStopsBeforeTheByteBound) {
  ListReply empty("entries", 10);
  EXPECT_EQ(Json::parse(empty.Finish()), Json::parse(R"({"ok":true,"entries":[],"truncated":false})"));

  constexpr size_t kMax = 1000;
  ListReply r("entries", 1000, kMax);
  int added = 0;
  while (r.Add(Json{{"name", std::string(50, 'x')}})) ++added;
  EXPECT_TRUE(r.full());
  EXPECT_FALSE(r.Add(Json{{"name", "y"}}));  // refuses even what would fit, once full
  const std::string text = r.Finish();
  EXPECT_LE(text.size(), kMax);
  Json j = Json::parse(text);
  EXPECT_EQ(j["truncated"], true);
  EXPECT_EQ(j["entries"].size(), static_cast<size_t>(added));
  EXPECT_GT(text.size(), kMax - 70);  // one entry is ~60 bytes
}

TEST(ListReply, EntryBoundAndInvalidUtf8) {
  ListReply r("processes", 2);
  EXPECT_TRUE(r.Add(Json{{"comm", "\xff\xfe"}}));  // replaced, not thrown
  EXPECT_TRUE(r.Add(Json{{"comm", "b"}}));
  EXPECT_FALSE(r.Add(Json{{"comm", "c"}}));
  Json j = Json::parse(r.Finish());
  EXPECT_EQ(j["processes"].size(), 2u);
  EXPECT_EQ(j["truncated"], true);
  EXPECT_EQ(j["processes"][0]["comm"], "\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(ParseArgv, SplitsLikeTheKernelWritesIt) {
  auto r = ParseArgv(std::string_view("sh\0-c\0x\0\0\0", 10), false);
  EXPECT_EQ(r.args, (std::vector<std::string>{"sh", "-c", "x", "", ""}));
  EXPECT_FALSE(r.truncated);
  // A rewritten argv may lack its final NUL.
  r = ParseArgv("name", false);
  EXPECT_EQ(r.args, (std::vector<std::string>{"name"}));
  EXPECT_FALSE(r.truncated);
  EXPECT_TRUE(ParseArgv("", false).args.empty());
}

TEST(ParseArgv, CutsEntriesBytesAndTheWindow) {
  std::string many;
  for (int i = 0; i < 1000; ++i) many += '\0';
  auto r = ParseArgv(many, false);
  EXPECT_EQ(r.args.size(), protocol::kMaxArgvEntries);
  EXPECT_TRUE(r.truncated);

  const std::string big(protocol::kMaxArgBytes + 10, 'a');
  r = ParseArgv(big + '\0' + "b" + '\0', false);
  ASSERT_EQ(r.args.size(), 2u);
  EXPECT_EQ(r.args[0].size(), protocol::kMaxArgBytes);
  EXPECT_EQ(r.args[1], "b");
  EXPECT_TRUE(r.truncated);

  std::string full;
  for (int i = 0; i < 20; ++i) full += std::string(protocol::kMaxArgBytes, 'c') + '\0';
  r = ParseArgv(full, false);
  size_t total = 0;
  for (const auto& a : r.args) total += a.size();
  EXPECT_EQ(total, protocol::kMaxArgvBytes);
  EXPECT_TRUE(r.truncated);

  // The window ends inside an entry: it is cut.
  r = ParseArgv("ab\0cd", true);
  EXPECT_TRUE(r.truncated);
  // The window ends on a NUL but the cmdline goes on.
  r = ParseArgv(std::string_view("ab\0", 3), true);
  EXPECT_EQ(r.args, (std::vector<std::string>{"ab"}));
  EXPECT_TRUE(r.truncated);
}

}  // namespace
}  // namespace sbx::agent
