#include "common/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace sbx::metrics {
namespace {

// The value of the sample line that starts with `series` followed by a space.
std::optional<std::string> SampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return line.substr(series.size() + 1);
  }
  return std::nullopt;
}

TEST(Metrics, EmptyRegistryExposesNothing) {
  Registry r;
  EXPECT_EQ(r.Expose(), "");
}

TEST(Metrics, CounterExposition) {
  Registry r;
  Counter& c = r.AddCounter("sbx_things_total", "Things done.").WithLabels();
  c.Inc();
  c.Inc(41);
  EXPECT_EQ(c.Value(), 42u);
  EXPECT_EQ(r.Expose(),
            "# HELP sbx_things_total Things done.\n"
            "# TYPE sbx_things_total counter\n"
            "sbx_things_total 42\n");
}

TEST(Metrics, LabelledChildrenAreOrderedByValuesAndEscaped) {
  Registry r;
  auto& f = r.AddCounter("sbx_ops_total", "Ops with a \\ and a\nnewline.", {"kind", "result"});
  f.WithLabels({"delete", "succeeded"}).Inc(2);
  f.WithLabels({"create", "succeeded"}).Inc();
  f.WithLabels({"create", "failed"});
  f.WithLabels({"odd", "a\"b\\c\nd"}).Inc(7);
  EXPECT_EQ(r.Expose(),
            "# HELP sbx_ops_total Ops with a \\\\ and a\\nnewline.\n"
            "# TYPE sbx_ops_total counter\n"
            "sbx_ops_total{kind=\"create\",result=\"failed\"} 0\n"
            "sbx_ops_total{kind=\"create\",result=\"succeeded\"} 1\n"
            "sbx_ops_total{kind=\"delete\",result=\"succeeded\"} 2\n"
            "sbx_ops_total{kind=\"odd\",result=\"a\\\"b\\\\c\\nd\"} 7\n");
}

TEST(Metrics, HelpKeepsQuotesUnescaped) {
  // Only label values escape '"'; in HELP it is an ordinary character.
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\n"), "say \"hi\"\\\\\\n");
  EXPECT_EQ(EscapeLabelValue("say \"hi\"\\\n"), "say \\\"hi\\\"\\\\\\n");
}

TEST(Metrics, GaugeAndValueFormatting) {
  Registry r;
  auto& f = r.AddGauge("sbx_level", "A level.", {"k"});
  f.WithLabels({"a"}).Set(0.5);
  Gauge& b = f.WithLabels({"b"});
  b.Inc(3);
  b.Dec();
  f.WithLabels({"c"}).Set(-2);
  f.WithLabels({"d"}).Set(1e-05);
  f.WithLabels({"e"}).Set(std::numeric_limits<double>::infinity());
  f.WithLabels({"f"}).Set(std::nan(""));
  f.WithLabels({"g"}).Set(1234567890123.0);
  EXPECT_EQ(r.Expose(),
            "# HELP sbx_level A level.\n"
            "# TYPE sbx_level gauge\n"
            "sbx_level{k=\"a\"} 0.5\n"
            "sbx_level{k=\"b\"} 2\n"
            "sbx_level{k=\"c\"} -2\n"
            "sbx_level{k=\"d\"} 1e-05\n"
            "sbx_level{k=\"e\"} +Inf\n"
            "sbx_level{k=\"f\"} NaN\n"
            "sbx_level{k=\"g\"} 1234567890123\n");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(0.1), "0.1");
}

TEST(Metrics, HistogramExposition) {
  Registry r;
  Histogram& h = r.AddHistogram("sbx_wait_seconds", "Waits.", {}, {0.5, 1}).WithLabels();
  h.Observe(0.25);
  h.Observe(0.5);  // `le` is inclusive
  h.Observe(0.75);
  h.Observe(2);
  EXPECT_EQ(r.Expose(),
            "# HELP sbx_wait_seconds Waits.\n"
            "# TYPE sbx_wait_seconds histogram\n"
            "sbx_wait_seconds_bucket{le=\"0.5\"} 2\n"
            "sbx_wait_seconds_bucket{le=\"1\"} 3\n"
            "sbx_wait_seconds_bucket{le=\"+Inf\"} 4\n"
            "sbx_wait_seconds_sum 3.5\n"
            "sbx_wait_seconds_count 4\n");
}

TEST(Metrics, LabelledHistogramPutsLeLast) {
  Registry r;
  auto& f = r.AddHistogram("sbx_lat_seconds", "Latency.", {"runtime", "source"},
                           {0.001, 0.01, std::numeric_limits<double>::infinity()});
  f.WithLabels({"ns", "warm"}).Observe(0.001);
  f.WithLabels({"ns", "cold"}).Observe(0.02);
  EXPECT_EQ(r.Expose(),
            "# HELP sbx_lat_seconds Latency.\n"
            "# TYPE sbx_lat_seconds histogram\n"
            "sbx_lat_seconds_bucket{runtime=\"ns\",source=\"cold\",le=\"0.001\"} 0\n"
            "sbx_lat_seconds_bucket{runtime=\"ns\",source=\"cold\",le=\"0.01\"} 0\n"
            "sbx_lat_seconds_bucket{runtime=\"ns\",source=\"cold\",le=\"+Inf\"} 1\n"
            "sbx_lat_seconds_sum{runtime=\"ns\",source=\"cold\"} 0.02\n"
            "sbx_lat_seconds_count{runtime=\"ns\",source=\"cold\"} 1\n"
            "sbx_lat_seconds_bucket{runtime=\"ns\",source=\"warm\",le=\"0.001\"} 1\n"
            "sbx_lat_seconds_bucket{runtime=\"ns\",source=\"warm\",le=\"0.01\"} 1\n"
            "sbx_lat_seconds_bucket{runtime=\"ns\",source=\"warm\",le=\"+Inf\"} 1\n"
            "sbx_lat_seconds_sum{runtime=\"ns\",source=\"warm\"} 0.001\n"
            "sbx_lat_seconds_count{runtime=\"ns\",source=\"warm\"} 1\n");
}

TEST(Metrics, HistogramNaNGoesToInfOnly) {
  Registry r;
  Histogram& h = r.AddHistogram("sbx_h", "h", {}, {1}).WithLabels();
  h.Observe(std::nan(""));
  auto s = h.Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(s.count, 1u);
}

TEST(Metrics, ScopedTimerObservesOnce) {
  Registry r;
  Histogram& h = r.AddHistogram("sbx_t_seconds", "t", {}, {10}).WithLabels();
  {
    ScopedTimer t(h);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto s = h.Collect();
  EXPECT_EQ(s.count, 1u);
  EXPECT_GE(s.sum, 0.002);
  EXPECT_LT(s.sum, 10);
}

TEST(Metrics, FamiliesAreOrderedByName) {
  Registry r;
  r.AddGauge("sbx_b", "b").WithLabels().Set(2);
  r.AddCounter("sbx_a_total", "a").WithLabels().Inc();
  r.AddGauge("process_x", "x").WithLabels().Set(3);
  EXPECT_EQ(r.Expose(),
            "# HELP process_x x\n# TYPE process_x gauge\nprocess_x 3\n"
            "# HELP sbx_a_total a\n# TYPE sbx_a_total counter\nsbx_a_total 1\n"
            "# HELP sbx_b b\n# TYPE sbx_b gauge\nsbx_b 2\n");
}

TEST(Metrics, FamilyWithoutChildrenShowsOnlyItsHeader) {
  Registry r;
  r.AddCounter("sbx_none_total", "None yet.", {"code"});
  EXPECT_EQ(r.Expose(), "# HELP sbx_none_total None yet.\n# TYPE sbx_none_total counter\n");
}

TEST(Metrics, ReferencesAreStableAndShared) {
  Registry r;
  auto& f = r.AddCounter("sbx_c_total", "c", {"k"});
  Counter* first = &f.WithLabels({"x"});
  for (int i = 0; i < 1000; ++i) f.WithLabels({std::to_string(i)});
  EXPECT_EQ(first, &f.WithLabels({"x"}));
  EXPECT_EQ(first, &f.WithLabels(std::vector<std::string>{"x"}));
  // The same definition registered again is the same family.
  EXPECT_EQ(&f, &r.AddCounter("sbx_c_total", "c", {"k"}));
  auto& h1 = r.AddHistogram("sbx_h_seconds", "h", {}, {1, 2});
  EXPECT_EQ(&h1, &r.AddHistogram("sbx_h_seconds", "h", {}, {1, 2}));
}

TEST(MetricsDeathTest, ConflictingOrMalformedDefinitionsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Registry r;
  r.AddCounter("sbx_c_total", "c", {"k"});
  EXPECT_DEATH(r.AddGauge("sbx_c_total", "c", {"k"}), "already registered");
  EXPECT_DEATH(r.AddCounter("sbx_c_total", "c", {"other"}), "already registered");
  EXPECT_DEATH(r.AddCounter("sbx_c_total", "c", {"k"}).WithLabels({"a", "b"}),
               "2 label values given for labels \\[k\\]");
  EXPECT_DEATH(r.AddCounter("9bad", "x"), "not a valid metric name");
  EXPECT_DEATH(r.AddCounter("sbx-dash", "x"), "not a valid metric name");
  EXPECT_DEATH(r.AddCounter("sbx_x", "x", {"__reserved"}), "not a valid label name");
  EXPECT_DEATH(r.AddCounter("sbx_x", "x", {"a", "a"}), "appears twice");
  EXPECT_DEATH(r.AddHistogram("sbx_h", "x", {"le"}, {1}), "not a valid label name");
  EXPECT_DEATH(r.AddHistogram("sbx_h", "x", {}, {1, 1}), "strictly increasing");
  EXPECT_DEATH(r.AddHistogram("sbx_h", "x", {}, {2, 1}), "strictly increasing");
  EXPECT_DEATH(r.AddHistogram("sbx_h", "x", {}, {1}).WithLabels({"a"}), "1 label values");
  auto keep = r.AddCallback("sbx_cb", "cb", Type::kGauge, {}, [](CallbackSamples& s) { s.Add(1); });
  EXPECT_DEATH((void)r.AddCallback("sbx_cb", "cb", Type::kGauge, {}, [](CallbackSamples&) {}),
               "already registered");
  EXPECT_DEATH(r.AddGauge("sbx_cb", "cb"), "already registered");
  auto bad = r.AddCallback("sbx_cb2", "cb", Type::kGauge, {"state"},
                           [](CallbackSamples& s) { s.Add(1); });
  EXPECT_DEATH(r.Expose(), "sbx_cb2: callback gave 0 label values, the metric has 1 labels");
}

TEST(Metrics, CallbackIsEvaluatedAtEachScrapeAndSorted) {
  Registry r;
  int calls = 0;
  std::map<std::string, int> pool = {{"warm", 3}, {"cold", 1}};
  {
    CallbackHandle h = r.AddCallback("sbx_pool", "Pool \"sizes\".", Type::kGauge, {"kind"},
                                     [&](CallbackSamples& s) {
                                       ++calls;
                                       // Reported out of order on purpose.
                                       s.Add({"zeta"}, 0);
                                       for (const auto& [k, v] : pool) s.Add({k}, v);
                                     });
    EXPECT_EQ(r.Expose(),
              "# HELP sbx_pool Pool \"sizes\".\n"
              "# TYPE sbx_pool gauge\n"
              "sbx_pool{kind=\"cold\"} 1\n"
              "sbx_pool{kind=\"warm\"} 3\n"
              "sbx_pool{kind=\"zeta\"} 0\n");
    pool["warm"] = 0;
    EXPECT_EQ(SampleValue(r.Expose(), "sbx_pool{kind=\"warm\"}"), "0");
    EXPECT_EQ(calls, 2);

    // A moved handle keeps the registration.
    CallbackHandle moved = std::move(h);
    EXPECT_EQ(SampleValue(r.Expose(), "sbx_pool{kind=\"cold\"}"), "1");
  }
  // Gone with its handle, and its name is free again.
  EXPECT_EQ(r.Expose(), "");
  auto again = r.AddCallback("sbx_pool", "other help", Type::kCounter, {},
                             [](CallbackSamples& s) { s.Add(2.5); });
  EXPECT_EQ(r.Expose(), "# HELP sbx_pool other help\n# TYPE sbx_pool counter\nsbx_pool 2.5\n");
  again.Reset();
  EXPECT_EQ(r.Expose(), "");
}

TEST(Metrics, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(0.001, 2, 4), (std::vector<double>{0.001, 0.002, 0.004, 0.008}));
}

TEST(Metrics, ConcurrentUpdatesAreExact) {
  Registry r;
  auto& counters = r.AddCounter("sbx_n_total", "n", {"worker_group"});
  auto& hists = r.AddHistogram("sbx_d_seconds", "d", {}, {0.5, 1.5});
  Gauge& g = r.AddGauge("sbx_g", "g").WithLabels();
  constexpr int kThreads = 8;
  constexpr int kIters = 100000;
  std::atomic<bool> done{false};
  // A scraper runs throughout: exposition must never block or corrupt the writers.
  std::thread scraper([&] {
    while (!done.load()) {
      std::string text = r.Expose();
      ASSERT_NE(text.find("# TYPE sbx_n_total counter"), std::string::npos);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one child, found concurrently by each of them.
      Counter& c = counters.WithLabels({t % 2 == 0 ? "even" : std::to_string(t)});
      Histogram& h = hists.WithLabels();
      for (int i = 0; i < kIters; ++i) {
        c.Inc();
        h.Observe(i % 2 == 0 ? 1.0 : 2.0);
        g.Inc();
        g.Dec(0.5);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  scraper.join();

  EXPECT_EQ(counters.WithLabels({"even"}).Value(), uint64_t{kThreads / 2} * kIters);
  for (int t = 1; t < kThreads; t += 2) {
    EXPECT_EQ(counters.WithLabels({std::to_string(t)}).Value(), uint64_t{kIters});
  }
  auto s = hists.WithLabels().Collect();
  const uint64_t n = uint64_t{kThreads} * kIters;
  EXPECT_EQ(s.count, n);
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{0, n / 2, n}));
  EXPECT_DOUBLE_EQ(s.sum, 1.5 * static_cast<double>(n));
  EXPECT_DOUBLE_EQ(g.Value(), 0.5 * static_cast<double>(n));
  std::string text = r.Expose();
  EXPECT_EQ(SampleValue(text, "sbx_d_seconds_count"), std::to_string(n));
  EXPECT_EQ(SampleValue(text, "sbx_d_seconds_bucket{le=\"+Inf\"}"), std::to_string(n));
}

TEST(Metrics, ConcurrentRegistrationReturnsOneFamily) {
  Registry r;
  std::vector<Family<Counter>*> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = &r.AddCounter("sbx_shared_total", "s", {"a"}); });
  }
  for (auto& t : threads) t.join();
  for (auto* f : got) EXPECT_EQ(f, got[0]);
}

TEST(Metrics, ProcessMetricsReadThisProcess) {
  Registry r;
  auto handles = RegisterProcessMetrics(r);
  std::string text = r.Expose();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    ASSERT_TRUE(SampleValue(text, name).has_value()) << name << " missing in:\n" << text;
  }
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
  EXPECT_GT(std::stod(*SampleValue(text, "process_resident_memory_bytes")), 1 << 20);
  EXPECT_GE(std::stod(*SampleValue(text, "process_virtual_memory_bytes")),
            std::stod(*SampleValue(text, "process_resident_memory_bytes")));
  EXPECT_GT(std::stod(*SampleValue(text, "process_max_fds")), 0);

  const double start = std::stod(*SampleValue(text, "process_start_time_seconds"));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600) << "this test process started more than an hour ago?";

  // Burn a little CPU and open one more file: both must show.
  const double cpu0 = std::stod(*SampleValue(text, "process_cpu_seconds_total"));
  const int fds0 = std::stoi(*SampleValue(text, "process_open_fds"));
  volatile uint64_t x = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  while (std::chrono::steady_clock::now() < until) x = x + 1;
  int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  text = r.Expose();
  ::close(fd);
  EXPECT_GT(std::stod(*SampleValue(text, "process_cpu_seconds_total")), cpu0);
  EXPECT_EQ(std::stoi(*SampleValue(text, "process_open_fds")), fds0 + 1);
}

TEST(Metrics, DefaultRegistryHasProcessMetrics) {
  std::string text = Default().Expose();
  EXPECT_NE(text.find("\nprocess_open_fds "), std::string::npos) << text;
  EXPECT_EQ(&Default(), &Default());
}

}  // namespace
}  // namespace sbx::metrics
