#include "common/metrics.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>

#include <fmt/format.h>

namespace sbx::metrics {
namespace {

// A metric definition that cannot be right is a bug in the code that registers it; carrying
// on would publish a broken exposition, so it stops the process with the reason.
[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "metrics: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string_view TypeName(Type t) {
  switch (t) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, static_cast<size_t>(end - buf));
}

// `{a="x",b="y"}`, plus an extra label last (histograms' `le`); nothing when there are none.
void AppendLabels(std::string& out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, std::string_view extra_name = {},
                  std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return;
  out.push_back('{');
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out.push_back('"');
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out.push_back(',');
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out.push_back('"');
  }
  out.push_back('}');
}

void AppendSample(std::string& out, std::string_view name, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, std::string_view value) {
  out += name;
  AppendLabels(out, names, values);
  out.push_back(' ');
  out += value;
  out.push_back('\n');
}

std::vector<double> CheckedBuckets(const std::string& name, std::vector<double> b) {
  if (!b.empty() && std::isinf(b.back()) && b.back() > 0) b.pop_back();  // +Inf is implied
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b[i]) || (i > 0 && b[i] <= b[i - 1])) {
      Die(fmt::format("histogram {}: buckets must be finite and strictly increasing", name));
    }
  }
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Values and escaping

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Shortest text that reads back as the same double ("1", "0.005", "1e-05").
  return fmt::format("{}", v);
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Histogram

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const std::vector<double>& b = *bounds_;
  // `le` is inclusive: the first bound >= v. NaN compares false with everything and lands in
  // +Inf, where it can be told apart from real observations.
  const auto at = std::isnan(v) ? b.end() : std::lower_bound(b.begin(), b.end(), v);
  const size_t i = static_cast<size_t>(at - b.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.cumulative.resize(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  // The count is the +Inf bucket by construction, never a separate counter that could differ.
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Family

template <typename T>
T& Family<T>::WithLabels(std::initializer_list<std::string_view> values) {
  std::vector<std::string> v;
  v.reserve(values.size());
  for (std::string_view s : values) v.emplace_back(s);
  return Get(std::move(v));
}

template <typename T>
T& Family<T>::WithLabels(const std::vector<std::string>& values) {
  return Get(values);
}

template <typename T>
T& Family<T>::Get(std::vector<std::string> values) {
  if (values.size() != label_names_.size()) {
    Die(fmt::format("{}: {} label values given for labels [{}]", name_, values.size(),
                    fmt::join(label_names_, ", ")));
  }
  std::lock_guard lock(mu_);
  auto it = children_.find(values);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(bounds_);
  } else {
    child = std::make_unique<T>();
  }
  return *children_.emplace(std::move(values), std::move(child)).first->second;
}

template <typename T>
void Family<T>::WriteSamples(const std::string& name, std::string& out) const {
  std::lock_guard lock(mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Counter>) {
      std::string v;
      AppendUint(v, child->Value());
      AppendSample(out, name, label_names_, values, v);
    } else if constexpr (std::is_same_v<T, Gauge>) {
      AppendSample(out, name, label_names_, values, FormatValue(child->Value()));
    } else {
      const Histogram::Snapshot s = child->Collect();
      const std::vector<double>& bounds = child->bounds();
      const std::string bucket = name + "_bucket";
      for (size_t i = 0; i <= bounds.size(); ++i) {
        out += bucket;
        AppendLabels(out, label_names_, values, "le",
                     i < bounds.size() ? FormatValue(bounds[i]) : "+Inf");
        out.push_back(' ');
        AppendUint(out, s.cumulative[i]);
        out.push_back('\n');
      }
      AppendSample(out, name + "_sum", label_names_, values, FormatValue(s.sum));
      std::string count;
      AppendUint(count, s.count);
      AppendSample(out, name + "_count", label_names_, values, count);
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---------------------------------------------------------------------------------------------
// Callbacks

void CallbackSamples::Add(std::vector<std::string> label_values, double value) {
  if (label_values.size() != label_count_) {
    Die(fmt::format("{}: callback gave {} label values, the metric has {} labels", name_,
                    label_values.size(), label_count_));
  }
  samples_.emplace_back(std::move(label_values), value);
}

CallbackHandle& CallbackHandle::operator=(CallbackHandle&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = o.registry_;
    name_ = std::move(o.name_);
    o.registry_ = nullptr;
  }
  return *this;
}

void CallbackHandle::Reset() {
  if (registry_ != nullptr) registry_->Unregister(name_);
  registry_ = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Registry

Registry::Entry& Registry::Register(const std::string& name, const std::string& help, Type type,
                                    std::vector<std::string> label_names,
                                    std::vector<double> buckets, CallbackFn callback) {
  if (!ValidMetricName(name)) Die(fmt::format("'{}' is not a valid metric name", name));
  std::set<std::string_view> seen;
  for (const std::string& l : label_names) {
    if (!ValidLabelName(l) || (type == Type::kHistogram && l == "le")) {
      Die(fmt::format("{}: '{}' is not a valid label name here", name, l));
    }
    if (!seen.insert(l).second) Die(fmt::format("{}: label '{}' appears twice", name, l));
  }
  std::lock_guard lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    Entry& e = it->second;
    // A static family may be shared; a callback has exactly one owner.
    if (callback || e.callback || e.type != type || e.label_names != label_names ||
        e.buckets != buckets || e.help != help) {
      Die(fmt::format("metric {} is already registered with another definition", name));
    }
    return e;
  }
  const bool is_callback = static_cast<bool>(callback);
  Entry e{type, help, std::move(label_names), std::move(buckets), nullptr, std::move(callback)};
  if (!is_callback) {
    switch (type) {
      case Type::kCounter:
        e.family = std::make_unique<Family<Counter>>(name, e.label_names, nullptr);
        break;
      case Type::kGauge:
        e.family = std::make_unique<Family<Gauge>>(name, e.label_names, nullptr);
        break;
      case Type::kHistogram:
        e.family = std::make_unique<Family<Histogram>>(
            name, e.label_names, std::make_shared<const std::vector<double>>(e.buckets));
        break;
    }
  }
  return entries_.emplace(name, std::move(e)).first->second;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  Entry& e = Register(name, help, Type::kCounter, std::move(label_names), {}, nullptr);
  return static_cast<Family<Counter>&>(*e.family);
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  Entry& e = Register(name, help, Type::kGauge, std::move(label_names), {}, nullptr);
  return static_cast<Family<Gauge>&>(*e.family);
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> buckets) {
  Entry& e = Register(name, help, Type::kHistogram, std::move(label_names),
                      CheckedBuckets(name, std::move(buckets)), nullptr);
  return static_cast<Family<Histogram>&>(*e.family);
}

CallbackHandle Registry::AddCallback(const std::string& name, const std::string& help, Type type,
                                     std::vector<std::string> label_names, CallbackFn fn) {
  if (type == Type::kHistogram) {
    Die(fmt::format("{}: a callback metric cannot be a histogram", name));
  }
  if (!fn) Die(fmt::format("{}: empty callback", name));
  Register(name, help, type, std::move(label_names), {}, std::move(fn));
  return CallbackHandle(this, name);
}

void Registry::Unregister(const std::string& name) {
  std::lock_guard lock(mu_);
  entries_.erase(name);
}

std::string Registry::Expose() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, e] : entries_) {
    out += "# HELP ";
    out += name;
    out.push_back(' ');
    out += EscapeHelp(e.help);
    out += "\n# TYPE ";
    out += name;
    out.push_back(' ');
    out += TypeName(e.type);
    out.push_back('\n');
    if (e.family) {
      e.family->WriteSamples(name, out);
      continue;
    }
    CallbackSamples samples(e.label_names.size());
    samples.name_ = name;
    e.callback(samples);
    std::sort(samples.samples_.begin(), samples.samples_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [values, v] : samples.samples_) {
      AppendSample(out, name, e.label_names, values, FormatValue(v));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Process metrics

namespace {

std::optional<std::string> ReadSmallFile(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Whitespace-separated fields of /proc/self/stat after the command name, which may itself
// contain spaces and parentheses: field 3 (state) is fields[0].
std::optional<std::vector<std::string_view>> StatFields(const std::string& stat) {
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string_view> fields;
  std::string_view rest(stat);
  rest.remove_prefix(close + 1);
  while (!rest.empty()) {
    size_t b = rest.find_first_not_of(" \n");
    if (b == std::string_view::npos) break;
    rest.remove_prefix(b);
    size_t e = rest.find_first_of(" \n");
    fields.push_back(rest.substr(0, e));
    if (e == std::string_view::npos) break;
    rest.remove_prefix(e);
  }
  return fields;
}

template <typename N>
std::optional<N> ParseNumber(std::string_view s) {
  N v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Seconds since the epoch at which this process started: its start in clock ticks after boot
// (/proc/self/stat field 22) plus the boot time (/proc/stat btime).
std::optional<double> ProcessStartTime() {
  auto stat = ReadSmallFile("/proc/self/stat");
  auto sys = ReadSmallFile("/proc/stat");
  if (!stat || !sys) return std::nullopt;
  auto fields = StatFields(*stat);
  if (!fields || fields->size() < 20) return std::nullopt;
  auto start_ticks = ParseNumber<uint64_t>((*fields)[19]);
  size_t pos = sys->find("\nbtime ");
  if (!start_ticks || pos == std::string::npos) return std::nullopt;
  std::string_view btime_text(*sys);
  btime_text.remove_prefix(pos + 7);
  btime_text = btime_text.substr(0, btime_text.find('\n'));
  auto btime = ParseNumber<uint64_t>(btime_text);
  const long ticks = ::sysconf(_SC_CLK_TCK);
  if (!btime || ticks <= 0) return std::nullopt;
  return static_cast<double>(*btime) +
         static_cast<double>(*start_ticks) / static_cast<double>(ticks);
}

std::optional<int64_t> OpenFds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  const int own = ::dirfd(dir);
  int64_t n = 0;
  while (dirent* d = ::readdir(dir)) {
    if (d->d_name[0] == '.') continue;
    // The directory stream's own descriptor is an artefact of counting.
    if (ParseNumber<int>(d->d_name) == own) continue;
    ++n;
  }
  ::closedir(dir);
  return n;
}

}  // namespace

std::vector<CallbackHandle> RegisterProcessMetrics(Registry& registry) {
  std::vector<CallbackHandle> h;
  h.push_back(registry.AddCallback(
      "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
      Type::kCounter, {}, [](CallbackSamples& s) {
        rusage ru{};
        if (::getrusage(RUSAGE_SELF, &ru) != 0) return;
        auto secs = [](const timeval& tv) {
          return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
        };
        s.Add(secs(ru.ru_utime) + secs(ru.ru_stime));
      }));
  auto statm = [](size_t field) -> std::optional<double> {
    auto text = ReadSmallFile("/proc/self/statm");
    if (!text) return std::nullopt;
    std::string_view rest(*text);
    for (size_t i = 0; i < field; ++i) {
      size_t sp = rest.find(' ');
      if (sp == std::string_view::npos) return std::nullopt;
      rest.remove_prefix(sp + 1);
    }
    auto pages = ParseNumber<uint64_t>(rest.substr(0, rest.find_first_of(" \n")));
    if (!pages) return std::nullopt;
    return static_cast<double>(*pages) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  };
  h.push_back(registry.AddCallback("process_resident_memory_bytes",
                                   "Resident memory size in bytes.", Type::kGauge, {},
                                   [statm](CallbackSamples& s) {
                                     if (auto v = statm(1)) s.Add(*v);
                                   }));
  h.push_back(registry.AddCallback("process_virtual_memory_bytes",
                                   "Virtual memory size in bytes.", Type::kGauge, {},
                                   [statm](CallbackSamples& s) {
                                     if (auto v = statm(0)) s.Add(*v);
                                   }));
  h.push_back(registry.AddCallback("process_open_fds", "Number of open file descriptors.",
                                   Type::kGauge, {}, [](CallbackSamples& s) {
                                     if (auto n = OpenFds()) s.Add(static_cast<double>(*n));
                                   }));
  h.push_back(registry.AddCallback(
      "process_max_fds", "Maximum number of open file descriptors.", Type::kGauge, {},
      [](CallbackSamples& s) {
        rlimit rl{};
        if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
        s.Add(rl.rlim_cur == RLIM_INFINITY ? std::numeric_limits<double>::infinity()
                                           : static_cast<double>(rl.rlim_cur));
      }));
  // Fixed for the life of the process: read once.
  const std::optional<double> start = ProcessStartTime();
  h.push_back(registry.AddCallback("process_start_time_seconds",
                                   "Start time of the process since unix epoch in seconds.",
                                   Type::kGauge, {}, [start](CallbackSamples& s) {
                                     if (start) s.Add(*start);
                                   }));
  return h;
}

Registry& Default() {
  // Never destroyed: threads still running at exit may update or scrape it. The process
  // metrics' handles live beside the registry in one object the static pointer keeps
  // reachable (a separate, never-read static was optimized away and LeakSanitizer then saw
  // the handles as leaked).
  struct DefaultRegistry {
    Registry registry;
    std::vector<CallbackHandle> process;
  };
  static DefaultRegistry* d = [] {
    auto* r = new DefaultRegistry;
    r->process = RegisterProcessMetrics(r->registry);
    return r;
  }();
  return d->registry;
}

}  // namespace sbx::metrics
