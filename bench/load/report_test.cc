#include "load/report.h"

#include <gtest/gtest.h>

namespace sbx::load {
namespace {

nlohmann::json Lat(double p50, double p99 = 0) {
  return {{"n", 10}, {"p50_ms", p50}, {"p99_ms", p99}};
}

TEST(BuildRatiosTest, DividesP50sAndThroughputs) {
  nlohmann::json scen = {{"first_output", Lat(30)},
                         {"exec", Lat(3)},
                         {"attach", {{"throughput", {{"value", 400.0}, {"unit", "MB/s"}}}}},
                         {"attach_binary", {{"throughput", {{"value", 1800.0}, {"unit", "MB/s"}}}}}};
  nlohmann::json peers = {{"bwrap_echo", Lat(12)},
                          {"fork_exec_true", Lat(1.5)},
                          {"pipe", {{"throughput", {{"value", 2000.0}, {"unit", "MB/s"}}}}}};
  nlohmann::json r = BuildRatios(scen, peers);
  EXPECT_DOUBLE_EQ(r["first_output_vs_bwrap"]["value"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(r["exec_vs_fork_exec"]["value"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(r["attach_vs_pipe"]["value"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(r["attach_binary_vs_pipe"]["value"].get<double>(), 0.9);
  // A side that was not measured gives no ratio rather than a bogus one.
  EXPECT_FALSE(r.contains("first_output_vs_runc"));
  EXPECT_FALSE(r.contains("create_cold_vs_bwrap"));
}

// An attach run with the pipe peer beside it is divided by those runs, not by the peer
// list's; one without them falls back to the peer list's.
TEST(BuildRatiosTest, AttachPrefersThePipeRunsBesideIt) {
  nlohmann::json scen = {
      {"attach", {{"throughput", {{"value", 600.0}, {"unit", "MB/s"}}},
                  {"extra", {{"pipe_beside_mb_s", 1000.0}}}}},
      {"attach_binary", {{"throughput", {{"value", 800.0}, {"unit", "MB/s"}}}}}};
  nlohmann::json peers = {{"pipe", {{"throughput", {{"value", 500.0}, {"unit", "MB/s"}}}}}};
  nlohmann::json r = BuildRatios(scen, peers);
  EXPECT_DOUBLE_EQ(r["attach_vs_pipe"]["value"].get<double>(), 0.6);
  EXPECT_NE(r["attach_vs_pipe"]["denominator"].get<std::string>().find("beside"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(r["attach_binary_vs_pipe"]["value"].get<double>(), 1.6);
}

TEST(BuildRatiosTest, SkippedOrMissingSidesAreLeftOut) {
  nlohmann::json scen = {{"first_output", {{"n", 0}, {"p50_ms", nullptr}}}};
  nlohmann::json peers = {{"bwrap_echo", {{"missing", "bwrap not found"}, {"p50_ms", nullptr}}}};
  EXPECT_TRUE(BuildRatios(scen, peers).empty());
}

TEST(BuildTargetsTest, JudgesEachDirectionAndMarksMissingMeasurements) {
  nlohmann::json scen = {
      {"create_cold", Lat(12)},
      {"concurrent_create", Lat(50, 140)},
      {"sustained", {{"throughput", {{"value", 250.0}, {"unit", "cycles/s"}}}}},
      {"density", {{"extra", {{"host_mem_per_sandbox_mib", 2.5}, {"running", 20}}}}}};
  nlohmann::json ratios = {{"attach_vs_pipe", {{"value", 0.3}}},
                           {"create_cold_vs_bwrap", {{"value", 0.45}}},
                           {"attach_binary_vs_pipe", {{"value", 0.85}}}};
  nlohmann::json t = BuildTargets(scen, ratios);
  auto find = [&](const std::string& prefix) -> nlohmann::json {
    for (const auto& x : t) {
      if (x["name"].get<std::string>().rfind(prefix, 0) == 0) return x;
    }
    return nullptr;
  };
  EXPECT_EQ(find("create → running, cold")["met"], false);
  EXPECT_EQ(find("create → running, cold")["measured"], 12.0);
  EXPECT_TRUE(find("create → running, warm")["met"].is_null());
  EXPECT_EQ(find("50 concurrent")["met"], true);
  EXPECT_EQ(find("sustained")["met"], true);
  EXPECT_EQ(find("attach throughput")["met"], false);
  EXPECT_EQ(find("binary attach throughput")["met"], true);
  EXPECT_EQ(find("binary attach throughput")["target"], 0.8);
  EXPECT_EQ(find("host memory")["met"], true);
  EXPECT_EQ(find("create → running, cold, vs bwrap")["met"], true);
  // 20 sandboxes of a quick run are far from the 5,000 the issue asks for.
  EXPECT_EQ(find("sandboxes running")["met"], false);
  EXPECT_EQ(find("sandboxes running")["measured"], 20.0);
  // The RSS target names the density actually reached.
  EXPECT_FALSE(find("sbxd RSS with 20 sandboxes").is_null());
  for (const auto& x : t) {
    EXPECT_TRUE(x.contains("target"));
    EXPECT_TRUE(x.contains("unit"));
    EXPECT_TRUE(x["op"] == "<=" || x["op"] == ">=");
  }
}

TEST(BuildRatiosTest, BinaryAttachWhenMeasured) {
  nlohmann::json peers = {{"pipe", {{"throughput", {{"value", 1000.0}, {"unit", "MB/s"}}}}}};
  nlohmann::json scen = {{"attach_binary", {{"throughput", {{"value", 900.0}, {"unit", "MB/s"}}}}}};
  EXPECT_DOUBLE_EQ(BuildRatios(scen, peers)["attach_binary_vs_pipe"]["value"].get<double>(), 0.9);
  EXPECT_FALSE(BuildRatios(nlohmann::json::object(), peers).contains("attach_binary_vs_pipe"));
}

TEST(BuildRepeatableTest, CollectsMeteredScenariosOnly) {
  nlohmann::json scen = {
      {"create_cold", {{"extra", {{"cpu_ms_per_op", 3.5}, {"syscalls_per_op", 900.0},
                                  {"cpu_ops", 200}, {"warmup_iterations", 1}}}}},
      {"exec", {{"extra", {{"cpu_unavailable", "no --sbxd-pid"}}}}},
      {"pause", {{"extra", {{"note", "x"}}}}}};
  nlohmann::json rows = BuildRepeatable(scen);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["scenario"], "create_cold");
  EXPECT_DOUBLE_EQ(rows[0]["cpu_ms_per_op"].get<double>(), 3.5);
  EXPECT_FALSE(rows[0].contains("warmup_iterations"));
  EXPECT_EQ(rows[1]["cpu_unavailable"], "no --sbxd-pid");
}

TEST(FormatSummaryLineTest, SaysWhyNothingWasMeasured) {
  EXPECT_NE(FormatSummaryLine("pause", {{"skipped", "server has no pause"}}).find("skipped"),
            std::string::npos);
  std::string line = FormatSummaryLine(
      "exec", {{"n", 3}, {"errors", 0}, {"p50_ms", 1.5}, {"p90_ms", 2.0}, {"p99_ms", 2.5},
               {"throughput", {{"value", 600.0}, {"unit", "ops/s"}}}});
  EXPECT_NE(line.find("1.50"), std::string::npos);
  EXPECT_NE(line.find("600.0 ops/s"), std::string::npos);
}

}  // namespace
}  // namespace sbx::load
