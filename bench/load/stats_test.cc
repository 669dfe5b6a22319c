#include "load/stats.h"

#include <gtest/gtest.h>

namespace sbx::load {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_NEAR(Percentile(v, 90), 3.7, 1e-12);
}

TEST(PercentileTest, SingleSampleIsEveryPercentile) {
  std::vector<double> v = {7.5};
  EXPECT_DOUBLE_EQ(Percentile(v, 1), 7.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 7.5);
}

TEST(PercentileTest, P99OfHundredIsNearTheTop) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_NEAR(Percentile(v, 99), 99.01, 1e-9);
  EXPECT_NEAR(Percentile(v, 50), 50.5, 1e-9);
}

TEST(SummarizeTest, SortsAndComputesEverything) {
  auto s = Summarize({5, 1, 3});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->n, 3u);
  EXPECT_DOUBLE_EQ(s->p50, 3);
  EXPECT_DOUBLE_EQ(s->min, 1);
  EXPECT_DOUBLE_EQ(s->max, 5);
  EXPECT_DOUBLE_EQ(s->mean, 3);
}

TEST(SummarizeTest, EmptyIsNothing) { EXPECT_FALSE(Summarize({}).has_value()); }

TEST(ResultToJsonTest, HasTheReportedShape) {
  Result r;
  r.samples_ms = {2.0004, 1.0, 3.0};
  r.AddError("boom");
  r.throughput = 12.345;
  r.throughput_unit = "ops/s";
  r.extra["k"] = 1;
  nlohmann::json j = ResultToJson(r);
  EXPECT_EQ(j["n"], 3);
  EXPECT_EQ(j["errors"], 1);
  EXPECT_EQ(j["error_messages"][0], "boom");
  EXPECT_DOUBLE_EQ(j["p50_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["min_ms"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["max_ms"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["throughput"]["value"].get<double>(), 12.35);
  EXPECT_EQ(j["throughput"]["unit"], "ops/s");
  EXPECT_EQ(j["extra"]["k"], 1);
  // Samples keep their order (iteration order), rounded to microseconds.
  ASSERT_EQ(j["samples_ms"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["samples_ms"][0].get<double>(), 2.0);
  EXPECT_FALSE(j.contains("skipped"));
}

TEST(ResultToJsonTest, NoSamplesGivesNullStatisticsNotZeros) {
  Result r;
  r.skipped = "server has no pause";
  nlohmann::json j = ResultToJson(r);
  EXPECT_EQ(j["skipped"], "server has no pause");
  EXPECT_EQ(j["n"], 0);
  EXPECT_TRUE(j["p50_ms"].is_null());
  EXPECT_TRUE(j["p99_ms"].is_null());
  EXPECT_TRUE(j["throughput"].is_null());
  EXPECT_TRUE(j["samples_ms"].empty());
}

TEST(ResultTest, KeepsOnlyTheFirstFewMessagesButCountsAll) {
  Result r;
  for (int i = 0; i < 20; ++i) r.AddError("e" + std::to_string(i));
  EXPECT_EQ(r.errors, 20u);
  EXPECT_EQ(r.error_messages.size(), 5u);
  EXPECT_EQ(r.error_messages[0], "e0");
}

}  // namespace
}  // namespace sbx::load
