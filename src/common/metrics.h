// Metrics in the Prometheus text exposition format 0.0.4: counters, gauges, histograms with
// fixed buckets, label families, and callback metrics evaluated at scrape time.
//
// Hot paths (create, exec, streamed output) update metrics with relaxed atomics only. A family's
// WithLabels() takes the family's lock to find or create the child, so callers on hot paths
// look the child up once and keep the reference: children are never removed, and a reference
// stays valid for the registry's lifetime.
//
//   auto& ops = registry.AddCounter("sbx_operations_total", "Finished operations.",
//                                   {"kind", "result"});
//   metrics::Counter& create_ok = ops.WithLabels({"create", "succeeded"});  // cache this
//   create_ok.Inc();
//
// Registering the same name again with the same type, labels (and buckets) returns the family
// already registered, so that independent components can share one. A conflicting definition,
// a malformed name or a wrong number of label values is a bug in the caller's code, not a
// runtime condition: it aborts with a message naming the metric.
//
// Thread safety: everything here is safe to use concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::metrics {

enum class Type { kCounter, kGauge, kHistogram };

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Inc(double d = 1) { v_.fetch_add(d, std::memory_order_relaxed); }
  void Dec(double d = 1) { v_.fetch_sub(d, std::memory_order_relaxed); }
  double Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Buckets are upper bounds (inclusive, as Prometheus' `le`), strictly increasing; +Inf is
// implied. Counts are kept per bucket and made cumulative at scrape, so an observation costs
// a binary search and two atomic adds.
class Histogram {
 public:
  explicit Histogram(std::shared_ptr<const std::vector<double>> bounds);

  void Observe(double v);
  void ObserveDuration(std::chrono::steady_clock::duration d) {
    Observe(std::chrono::duration<double>(d).count());
  }

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Consistent per bucket; under concurrent Observe() the sum may lead or trail the buckets by
  // the observations in flight, as in every Prometheus client.
  Snapshot Collect() const;
  const std::vector<double>& bounds() const { return *bounds_; }

 private:
  std::shared_ptr<const std::vector<double>> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_->size() + 1, last is +Inf
  std::atomic<double> sum_{0};
};

// Observes the time from construction to destruction, in seconds.
class ScopedTimer {
 public:
  explicit ScopedTimer(Histogram& h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { h_.ObserveDuration(std::chrono::steady_clock::now() - start_); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  Histogram& h_;
  std::chrono::steady_clock::time_point start_;
};

// Bucket helpers (seconds).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

namespace internal {
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  // Appends the family's sample lines (not HELP/TYPE).
  virtual void WriteSamples(const std::string& name, std::string& out) const = 0;
};
}  // namespace internal

template <typename T>
class Family final : public internal::FamilyBase {
 public:
  Family(std::string name, std::vector<std::string> label_names,
         std::shared_ptr<const std::vector<double>> bounds)
      : name_(std::move(name)), label_names_(std::move(label_names)), bounds_(std::move(bounds)) {}

  // The child for these label values, in the order of the family's label names; created at 0
  // on first use. The reference stays valid as long as the registry.
  T& WithLabels(std::initializer_list<std::string_view> values = {});
  T& WithLabels(const std::vector<std::string>& values);

  const std::vector<std::string>& label_names() const { return label_names_; }
  void WriteSamples(const std::string& name, std::string& out) const override;

 private:
  T& Get(std::vector<std::string> values);

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::shared_ptr<const std::vector<double>> bounds_;  // histograms only
  mutable std::mutex mu_;
  // Ordered by label values: the exposition is deterministic.
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

// What a callback metric reports at one scrape.
class CallbackSamples {
 public:
  explicit CallbackSamples(size_t label_count) : label_count_(label_count) {}
  // `label_values` in the order of the metric's label names.
  void Add(std::vector<std::string> label_values, double value);
  void Add(double value) { Add({}, value); }

 private:
  friend class Registry;
  size_t label_count_;
  std::string name_;  // for the message when a callback passes the wrong number of labels
  std::vector<std::pair<std::vector<std::string>, double>> samples_;
};
using CallbackFn = std::function<void(CallbackSamples&)>;

class Registry;

// Keeps a callback metric registered; destroying it unregisters the callback, waiting for a
// scrape that is running it. Whatever the callback reads must outlive the handle.
class CallbackHandle {
 public:
  CallbackHandle() = default;
  CallbackHandle(Registry* registry, std::string name)
      : registry_(registry), name_(std::move(name)) {}
  CallbackHandle(CallbackHandle&& o) noexcept { *this = std::move(o); }
  CallbackHandle& operator=(CallbackHandle&& o) noexcept;
  CallbackHandle(const CallbackHandle&) = delete;
  CallbackHandle& operator=(const CallbackHandle&) = delete;
  ~CallbackHandle() { Reset(); }
  void Reset();

 private:
  Registry* registry_ = nullptr;
  std::string name_;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> buckets);

  // A gauge or counter whose samples `fn` reports at every scrape: for values that live
  // elsewhere (rows in the store, pool sizes, /proc). `fn` runs on the scraping thread while
  // the registry is locked, so it must be quick and must not call into this registry.
  [[nodiscard]] CallbackHandle AddCallback(const std::string& name, const std::string& help,
                                           Type type, std::vector<std::string> label_names,
                                           CallbackFn fn);

  // The whole registry in the text format 0.0.4, metrics ordered by name, samples by labels.
  std::string Expose() const;

 private:
  friend class CallbackHandle;
  struct Entry {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> buckets;
    std::unique_ptr<internal::FamilyBase> family;  // static metrics
    CallbackFn callback;                           // callback metrics
  };
  Entry& Register(const std::string& name, const std::string& help, Type type,
                  std::vector<std::string> label_names, std::vector<double> buckets,
                  CallbackFn callback);
  void Unregister(const std::string& name);

  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

// The process-wide registry that sbxd serves on /metrics; it already holds the process_*
// metrics (RegisterProcessMetrics). Tests build their own Registry instead.
Registry& Default();

// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds and process_start_time_seconds, read from /proc/self and
// getrusage/getrlimit at each scrape. A value that cannot be read is left out of that scrape.
std::vector<CallbackHandle> RegisterProcessMetrics(Registry& registry);

// The text format's escaping, exposed for tests.
std::string EscapeLabelValue(std::string_view v);
std::string EscapeHelp(std::string_view v);
std::string FormatValue(double v);

// The Content-Type of Expose()'s output.
inline constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace sbx::metrics
