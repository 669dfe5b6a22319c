#include "load/report.h"

#include <optional>

#include <fmt/format.h>

#include "load/stats.h"

namespace sbx::load {
namespace {

std::optional<double> Number(const nlohmann::json& j, const std::string& name,
                             const std::string& key) {
  if (!j.is_object() || !j.contains(name)) return std::nullopt;
  const auto& r = j[name];
  if (!r.is_object() || !r.contains(key) || !r[key].is_number()) return std::nullopt;
  return r[key].get<double>();
}

std::optional<double> Throughput(const nlohmann::json& j, const std::string& name) {
  if (!j.is_object() || !j.contains(name)) return std::nullopt;
  const auto& r = j[name];
  if (!r.is_object() || !r.contains("throughput") || !r["throughput"].is_object()) {
    return std::nullopt;
  }
  const auto& t = r["throughput"];
  if (!t.contains("value") || !t["value"].is_number()) return std::nullopt;
  return t["value"].get<double>();
}

std::optional<double> Extra(const nlohmann::json& j, const std::string& name,
                            const std::string& key) {
  if (!j.is_object() || !j.contains(name) || !j[name].contains("extra")) return std::nullopt;
  const auto& e = j[name]["extra"];
  if (!e.is_object() || !e.contains(key) || !e[key].is_number()) return std::nullopt;
  return e[key].get<double>();
}

}  // namespace

nlohmann::json BuildRatios(const nlohmann::json& scenarios, const nlohmann::json& peers) {
  nlohmann::json out = nlohmann::json::object();
  auto latency = [&](const std::string& name, const std::string& num, const std::string& den) {
    auto a = Number(scenarios, num, "p50_ms");
    auto b = Number(peers, den, "p50_ms");
    if (!a || !b || *b <= 0) return;
    out[name] = {{"value", Round(*a / *b, 3)},
                 {"numerator", fmt::format("scenario {} p50 ({} ms)", num, Round(*a))},
                 {"denominator", fmt::format("peer {} p50 ({} ms)", den, Round(*b))},
                 {"basis", "p50 latency, lower is better"}};
  };
  latency("create_cold_vs_bwrap", "create_cold", "bwrap_echo");
  latency("create_cold_vs_unshare", "create_cold", "unshare_echo");
  latency("create_cold_vs_runc", "create_cold", "runc_echo");
  latency("first_output_vs_bwrap", "first_output", "bwrap_echo");
  latency("first_output_vs_unshare", "first_output", "unshare_echo");
  latency("first_output_vs_runc", "first_output", "runc_echo");
  latency("exec_vs_fork_exec", "exec", "fork_exec_true");
  latency("exec_split_vs_fork_exec", "exec_split", "fork_exec_true");
  auto throughput = [&](const std::string& name, const std::string& num) {
    auto a = Throughput(scenarios, num);
    // The pipe's runs beside this scenario's when it has them (the peer list's runs were
    // minutes earlier, and this host's speed drifts by more than the targets' margins).
    std::optional<double> b;
    if (scenarios.is_object() && scenarios.contains(num)) {
      b = Number(scenarios[num], "extra", "pipe_beside_mb_s");
    }
    const bool beside = b.has_value();
    if (!beside) b = Throughput(peers, "pipe");
    if (!a || !b || *b <= 0) return;
    out[name] = {{"value", Round(*a / *b, 3)},
                 {"numerator", fmt::format("scenario {} ({} MB/s)", num, Round(*a, 1))},
                 {"denominator", fmt::format("{} ({} MB/s)",
                                             beside ? "the pipe peer's runs beside it" : "peer pipe",
                                             Round(*b, 1))},
                 {"basis", "throughput, higher is better"}};
  };
  throughput("attach_vs_pipe", "attach");
  // The binary attach stream (issue 15), when the run has it.
  throughput("attach_binary_vs_pipe", "attach_binary");
  return out;
}

nlohmann::json BuildTargets(const nlohmann::json& scenarios, const nlohmann::json& ratios) {
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](std::string name, std::string op, double target, std::optional<double> measured,
                 std::string unit, std::string basis) {
    nlohmann::json t = {{"name", std::move(name)}, {"op", op},       {"target", target},
                        {"unit", std::move(unit)}, {"basis", std::move(basis)}};
    if (measured) {
      t["measured"] = Round(*measured, 3);
      t["met"] = op == "<=" ? *measured <= target : *measured >= target;
    } else {
      t["measured"] = nullptr;
      t["met"] = nullptr;
    }
    out.push_back(std::move(t));
  };
  auto ratio = [&](const char* name) -> std::optional<double> {
    if (!ratios.contains(name)) return std::nullopt;
    return ratios[name]["value"].get<double>();
  };
  add("create → running, cold", "<=", 10, Number(scenarios, "create_cold", "p50_ms"), "ms",
      "create_cold p50");
  // Issue 15's goals: ratios to a peer in the same run, so that the host's speed cancels out.
  add("create → running, cold, vs bwrap", "<=", 0.5, ratio("create_cold_vs_bwrap"), "×",
      "create_cold p50 / bwrap_echo p50");
  add("create → running, warm pool", "<=", 3, Number(scenarios, "create_warm", "p50_ms"), "ms",
      "create_warm p50");
  add("create → first output of echo hi vs bwrap", "<=", 1.0, ratio("first_output_vs_bwrap"),
      "×", "first_output p50 / bwrap_echo p50");
  add("exec round trip vs fork+exec of /bin/true", "<=", 1.5, ratio("exec_vs_fork_exec"), "×",
      "exec p50 / fork_exec_true p50");
  auto conc = Extra(scenarios, "concurrent_create", "concurrency");
  add(fmt::format("{} concurrent creates, p99", conc ? static_cast<long>(*conc) : 50), "<=", 150,
      Number(scenarios, "concurrent_create", "p99_ms"), "ms", "concurrent_create p99");
  // The same goal for the burst served by a warm pool sized for it (reported beside the cold
  // one, which stays the row above).
  add(fmt::format("{} concurrent creates, p99, warm pool", conc ? static_cast<long>(*conc) : 50),
      "<=", 150, Number(scenarios, "concurrent_create_warm", "p99_ms"), "ms",
      "concurrent_create_warm p99");
  add("sustained create+exec+delete", ">=", 200, Throughput(scenarios, "sustained"),
      "cycles/s", "sustained throughput");
  add("attach throughput vs a pipe", ">=", 0.8, ratio("attach_vs_pipe"), "×",
      "attach MB/s / pipe MB/s");
  add("binary attach throughput vs a pipe", ">=", 0.8, ratio("attach_binary_vs_pipe"), "×",
      "attach_binary MB/s / pipe MB/s");
  add("sandboxes running on one host", ">=", 5000, Extra(scenarios, "density", "running"),
      "sandboxes", "density: running at the end of the fill");
  add("host memory per idle sandbox", "<=", 3,
      Extra(scenarios, "density", "host_mem_per_sandbox_mib"), "MiB",
      "density: MemAvailable drop / sandboxes");
  auto n = Extra(scenarios, "density", "running");
  add(fmt::format("sbxd RSS with {} sandboxes", n ? static_cast<long>(*n) : 500), "<=", 150,
      Extra(scenarios, "density", "sbxd_rss_mib"), "MiB", "density: sbxd VmRSS");
  return out;
}

nlohmann::json BuildRepeatable(const nlohmann::json& scenarios) {
  nlohmann::json out = nlohmann::json::array();
  if (!scenarios.is_object()) return out;
  for (const auto& [name, r] : scenarios.items()) {
    if (!r.is_object() || !r.contains("extra") || !r["extra"].is_object()) continue;
    const auto& e = r["extra"];
    if (!e.contains("cpu_ms_per_op") && !e.contains("cpu_unavailable")) continue;
    nlohmann::json row = {{"scenario", name}};
    for (const char* k : {"cpu_ms_per_op", "syscalls_per_op", "host_cpu_ms_per_op",
                          "cpu_ns_per_byte", "cpu_ops", "cpu_unavailable"}) {
      if (e.contains(k)) row[k] = e[k];
    }
    out.push_back(std::move(row));
  }
  return out;
}

std::string FormatSummaryLine(const std::string& name, const nlohmann::json& r) {
  for (const char* why : {"failure", "missing", "skipped"}) {
    if (r.contains(why)) {
      return fmt::format("{:<20} {}: {}", name, why, r[why].get<std::string>());
    }
  }
  auto f = [&](const char* key) {
    return r.contains(key) && r[key].is_number() ? fmt::format("{:9.2f}", r[key].get<double>())
                                                 : std::string("        -");
  };
  std::string tp = "-";
  if (r.contains("throughput") && r["throughput"].is_object()) {
    tp = fmt::format("{:.1f} {}", r["throughput"]["value"].get<double>(),
                     r["throughput"]["unit"].get<std::string>());
  }
  return fmt::format("{:<20} n={:<5} err={:<3} p50 {} p90 {} p99 {} ms  {}", name,
                     r.value("n", 0), r.value("errors", 0), f("p50_ms"), f("p90_ms"),
                     f("p99_ms"), tp);
}

}  // namespace sbx::load
