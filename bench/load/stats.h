// Samples and their summary for one scenario or peer, and the JSON shape they are reported in.
// Kept free of I/O so that the arithmetic (percentiles, nulls for empty sets) is unit-tested.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sbx::load {

using Clock = std::chrono::steady_clock;

inline double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Percentile by linear interpolation between closest ranks (numpy's default), so p50 of an
// even-sized set is the mean of the middle two. `sorted` must be ascending and non-empty.
double Percentile(const std::vector<double>& sorted, double p);

struct Summary {
  size_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, min = 0, max = 0;
};
// nullopt when there are no samples: a summary of nothing must not look like "0 ms".
std::optional<Summary> Summarize(std::vector<double> samples);

// What one scenario (or peer) measured. Either it ran (samples, errors, throughput, extra), was
// skipped on purpose (`skipped`: a reason that is not a failure), or could not run (`failure`).
struct Result {
  std::vector<double> samples_ms;
  size_t errors = 0;
  std::vector<std::string> error_messages;  // the first few, to say what failed
  std::optional<double> throughput;
  std::string throughput_unit;  // "ops/s", "cycles/s", "MB/s"
  nlohmann::json extra = nlohmann::json::object();
  std::string skipped;  // non-empty: not run, and that is fine ("server has no pause")
  std::string missing;  // non-empty (peers): the binary is not installed
  std::string failure;  // non-empty: the scenario could not run at all

  // Counts an error and keeps its message if there are not already enough of them.
  void AddError(std::string message);
  bool ran() const { return skipped.empty() && missing.empty() && failure.empty(); }
};

// {n, errors, p50_ms, …, throughput: {value, unit}, extra, samples_ms} (statistics are null
// when there are no samples); or {skipped}/{missing}/{failure} plus whatever was counted.
nlohmann::json ResultToJson(const Result& r);

// Rounds to `digits` decimals so that the JSON stays readable (samples are far noisier).
double Round(double v, int digits = 3);

}  // namespace sbx::load
