#include "load/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sbx::load {

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.size() == 1) return sorted.front();
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

std::optional<Summary> Summarize(std::vector<double> samples) {
  if (samples.empty()) return std::nullopt;
  std::sort(samples.begin(), samples.end());
  Summary s;
  s.n = samples.size();
  s.p50 = Percentile(samples, 50);
  s.p90 = Percentile(samples, 90);
  s.p99 = Percentile(samples, 99);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(s.n);
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

void Result::AddError(std::string message) {
  ++errors;
  if (error_messages.size() < 5) error_messages.push_back(std::move(message));
}

double Round(double v, int digits) {
  if (!std::isfinite(v)) return v;
  double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

nlohmann::json ResultToJson(const Result& r) {
  nlohmann::json j = nlohmann::json::object();
  if (!r.skipped.empty()) j["skipped"] = r.skipped;
  if (!r.missing.empty()) j["missing"] = r.missing;
  if (!r.failure.empty()) j["failure"] = r.failure;
  std::optional<Summary> s = Summarize(r.samples_ms);
  j["n"] = s ? s->n : 0;
  j["errors"] = r.errors;
  if (!r.error_messages.empty()) j["error_messages"] = r.error_messages;
  auto stat = [&](const char* key, double Summary::*field) {
    j[key] = s ? nlohmann::json(Round((*s).*field)) : nlohmann::json(nullptr);
  };
  stat("p50_ms", &Summary::p50);
  stat("p90_ms", &Summary::p90);
  stat("p99_ms", &Summary::p99);
  stat("mean_ms", &Summary::mean);
  stat("min_ms", &Summary::min);
  stat("max_ms", &Summary::max);
  if (r.throughput && std::isfinite(*r.throughput)) {
    j["throughput"] = {{"value", Round(*r.throughput, 2)}, {"unit", r.throughput_unit}};
  } else {
    j["throughput"] = nullptr;
  }
  j["extra"] = r.extra;
  nlohmann::json samples = nlohmann::json::array();
  for (double v : r.samples_ms) samples.push_back(Round(v));
  j["samples_ms"] = std::move(samples);
  return j;
}

}  // namespace sbx::load
