#include "net/denial_log.h"

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

TEST(DenialLog, KeepsTheLastAndCountsOnlyWhatItIsToldTo) {
  DenialLog log(3);
  for (int i = 0; i < 5; ++i) {
    log.Record("sb-a", Denial{.time = absl::FromUnixSeconds(i), .reason = "dns_name",
                              .name = "n" + std::to_string(i) + ".org", .protocol = "dns"});
  }
  log.Record("sb-a", Denial{.time = absl::FromUnixSeconds(9), .reason = "not_allowed",
                            .dest = "198.18.0.7", .protocol = "tcp", .port = 443},
             /*count=*/false);
  auto recent = log.Recent("sb-a");
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent[0].name, "n3.org");
  EXPECT_EQ(recent[2].reason, "not_allowed");
  EXPECT_EQ(log.Counts("sb-a"), (std::map<std::string, uint64_t>{{"dns_name", 5}}));
  EXPECT_TRUE(log.Recent("sb-b").empty());
  nlohmann::json j = DenialToJson(recent[2]);
  EXPECT_EQ(j["time"], "1970-01-01T00:00:09+00:00");
  EXPECT_EQ(j["port"], 443);
  EXPECT_FALSE(j.contains("name"));
  EXPECT_EQ(log.AllCounts().size(), 1u);
  log.Forget("sb-a");
  EXPECT_TRUE(log.Recent("sb-a").empty());
  EXPECT_TRUE(log.AllCounts().empty());
}

}  // namespace
}  // namespace sbx::net
