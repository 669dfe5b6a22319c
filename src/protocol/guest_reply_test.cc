#include "protocol/guest_reply.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/status_util.h"
#include "protocol/limits.h"

namespace sbx::protocol {
namespace {

using nlohmann::json;

absl::StatusOr<std::string> Processes(const std::string& payload) {
  return RewriteGuestList(payload, ProcessesReplySchema(), "{\"sandbox_id\":\"s1\",");
}

std::string Entry(const std::string& argv_json = "[\"sleep\",\"9\"]") {
  return "{\"pid\":7,\"ppid\":1,\"pgid\":7,\"state\":\"S\",\"comm\":\"sleep\",\"argv\":" +
         argv_json +
         ",\"argv_truncated\":false,\"uid\":0,\"user\":\"root\",\"started_at\":null,"
         "\"session_id\":\"ses_1\"}";
}

void ExpectBad(const absl::StatusOr<std::string>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << *r;
  EXPECT_EQ(ApiErrorCode(r.status()), "bad_agent_reply") << r.status();
  EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos) << r.status();
}

TEST(GuestReply, RewritesAProcessListToTheApiShape) {
  auto r = Processes("{\"ok\":true,\"processes\":[" + Entry() + "," + Entry() +
                     "],\"truncated\":true}");
  ASSERT_TRUE(r.ok()) << r.status();
  json j = json::parse(*r);
  EXPECT_EQ(j["sandbox_id"], "s1");
  ASSERT_EQ(j["processes"].size(), 2u);
  EXPECT_EQ(j["processes"][0], json::parse(Entry()));
  EXPECT_EQ(j["truncated"], true);
}

TEST(GuestReply, KeepsStringsByteExactThroughEscapes) {
  const std::string odd = "a\"b\\c\n\t\x01\x1f é 🙂";
  json e = json::parse(Entry());
  e["argv"] = json::array({odd, ""});
  e["comm"] = odd;
  auto r = Processes("{\"ok\":true,\"processes\":[" + e.dump() + "]}");
  ASSERT_TRUE(r.ok()) << r.status();
  json j = json::parse(*r);
  EXPECT_EQ(j["processes"][0]["argv"][0], odd);
  EXPECT_EQ(j["processes"][0]["argv"][1], "");
  EXPECT_EQ(j["processes"][0]["comm"], odd);
  EXPECT_EQ(j["truncated"], false);  // absent: false
}

TEST(GuestReply, DropsFieldsOutsideTheSchemaAndIgnoresUnknownTopLevelScalars) {
  auto r = Processes("{\"ok\":true,\"extra\":1,\"processes\":[{\"pid\":1,\"evil\":\"x\","
                     "\"also\":null}]}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(*r)["processes"][0], json::parse("{\"pid\":1}"));
}

TEST(GuestReply, AnErrorReplyBecomesTheAgentsStatus) {
  auto r = RewriteGuestList(
      "{\"ok\":false,\"error\":{\"code\":\"not_found\",\"message\":\"no such dir\","
      "\"reason\":\"path_not_found\"}}",
      ListReplySchema(), "{");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ApiErrorCode(r.status()), "path_not_found");
  EXPECT_NE(std::string(r.status().message()).find("no such dir"), std::string::npos);
  // No "ok" at all is not success either.
  auto none = RewriteGuestList("{\"entries\":[]}", ListReplySchema(), "{");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInternal);
}

TEST(GuestReply, RefusesWhatACorrectAgentNeverSends) {
  ExpectBad(Processes("{\"ok\":true}"), "no \"processes\" array");
  ExpectBad(Processes("{\"ok\":true,\"processes\":5}"), "no \"processes\" array");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[1]}"), "outside an entry");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[\"x\"]}"), "outside an entry");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[[]]}"), "an array");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[{\"pid\":{}}]}"), "too deep");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[{\"user\":[]}]}"), "an array in \"user\"");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[{\"argv\":[[]]}]}"), "an array");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[{\"argv\":[1]}]}"), "outside an entry");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[{\"pid\":1,\"pid\":2}]}"), "twice");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[],\"processes\":[]}"), "a second list");
  ExpectBad(Processes("{\"ok\":true,\"other\":{}}"), "an object in \"other\"");
  ExpectBad(Processes("{\"ok\":true,\"other\":[]}"), "an array in \"other\"");
  ExpectBad(Processes("[]"), "an array");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[]"), "not JSON");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[]} trailing"), "not JSON");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[\"\xff\"]}"), "not JSON");
  ExpectBad(Processes(""), "not JSON");
}

TEST(GuestReply, RefusesDeepNestingAtOnce) {
  // 400k levels: refused at the first level too deep, never walked.
  std::string deep = "{\"ok\":true,\"processes\":[{\"argv\":";
  deep += std::string(400000, '[') + std::string(400000, ']') + "}]}";
  ExpectBad(Processes(deep), "an array");
  std::string deep_obj = "{\"ok\":true,\"x\":" + std::string(400000, '{');
  ExpectBad(Processes(deep_obj), "an object");
}

TEST(GuestReply, EnforcesTheBoundsOfLimitsH) {
  // Entries.
  std::string many = "{\"ok\":true,\"processes\":[";
  for (size_t i = 0; i <= kMaxProcessEntries; ++i) many += (i ? ",{}" : "{}");
  many += "]}";
  ExpectBad(Processes(many), "more than 4096 entries");
  // argv items, bytes per item, bytes in all.
  json argv = json::array();
  for (size_t i = 0; i <= kMaxArgvEntries; ++i) argv.push_back("");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[" + Entry(argv.dump()) + "]}"),
            "more than 256 items");
  ExpectBad(Processes("{\"ok\":true,\"processes\":[" +
                      Entry(json::array({std::string(kMaxArgBytes + 1, 'a')}).dump()) + "]}"),
            "bytes (limit 4096)");
  json fat = json::array();
  for (size_t i = 0; i < kMaxArgvBytes / kMaxArgBytes + 1; ++i) {
    fat.push_back(std::string(kMaxArgBytes, 'a'));
  }
  ExpectBad(Processes("{\"ok\":true,\"processes\":[" + Entry(fat.dump()) + "]}"),
            "more than 32768 bytes");
  // One string field.
  json e = json::parse(Entry());
  e["user"] = std::string(kMaxFieldBytes + 1, 'u');
  ExpectBad(Processes("{\"ok\":true,\"processes\":[" + e.dump() + "]}"), "\"user\"");
  // The payload as a whole.
  ExpectBad(Processes(std::string(kMaxGuestReplyBytes + 1, ' ')), "bytes (limit");
  // At the bounds everything passes.
  json at = json::array();
  for (size_t i = 0; i < kMaxArgvEntries; ++i) at.push_back(std::string(kMaxArgvBytes / kMaxArgvEntries, 'a'));
  auto ok = Processes("{\"ok\":true,\"processes\":[" + Entry(at.dump()) + "]}");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(json::parse(*ok)["processes"][0]["argv"].size(), kMaxArgvEntries);
}

TEST(GuestReply, ListEntriesHaveNoArrayField) {
  auto r = RewriteGuestList(
      "{\"ok\":true,\"entries\":[{\"name\":\"a\",\"path\":\"/a\",\"type\":\"file\",\"size\":3,"
      "\"mode\":420,\"uid\":0,\"gid\":0,\"mtime\":\"2026-01-01T00:00:00Z\"}],\"truncated\":false}",
      ListReplySchema(), "{");
  ASSERT_TRUE(r.ok()) << r.status();
  json j = json::parse(*r);
  EXPECT_EQ(j["entries"][0]["size"], 3);
  EXPECT_EQ(j.size(), 2u);  // entries and truncated
  ExpectBad(RewriteGuestList("{\"ok\":true,\"entries\":[{\"argv\":[]}]}", ListReplySchema(), "{"),
            "an array");
}

TEST(GuestReply, NumbersKeepTheirValue) {
  auto r = Processes("{\"ok\":true,\"processes\":[{\"pid\":-1,\"uid\":18446744073709551615,"
                     "\"ppid\":1.5e300}]}");
  ASSERT_TRUE(r.ok()) << r.status();
  json p = json::parse(*r)["processes"][0];
  EXPECT_EQ(p["pid"], -1);
  EXPECT_EQ(p["uid"].get<uint64_t>(), 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(p["ppid"].get<double>(), 1.5e300);
}

}  // namespace
}  // namespace sbx::protocol
