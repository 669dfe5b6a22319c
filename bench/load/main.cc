// sbx-load: the benchmark suite of docs/benchmarks.md. Drives a running sbxd over HTTP like a
// real client, spawns the peers (bare fork+exec, bwrap, unshare, runc, a pipe) in the same run,
// and writes every sample, summary, ratio and target to one JSON file (bench/report.py turns
// it into the plot and the tables).
#include <algorithm>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "load/http_conn.h"
#include "load/peers.h"
#include "load/report.h"
#include "load/scenarios.h"
#include "load/sysinfo.h"

namespace {

using namespace sbx::load;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

const std::vector<std::string> kPeers = {"fork_exec_true", "bwrap_echo", "unshare_echo",
                                         "runc_echo", "pipe"};

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"sbx-load: the sbx benchmark suite (HTTP load against a running sbxd, plus peers)",
               "sbx-load"};
  std::string url, token, warm_url, out_path, scenarios_flag, peers_flag;
  std::vector<std::string> extra_notes;
  int sbxd_pid = 0;
  bool quick = false, require_peers = false;
  // Count overrides: unset means the mode's default.
  std::optional<int> create_n, warm_n, first_output_n, exec_n, concurrency, rounds, workers,
      attach_n, density_n, density_parallel, pause_n, peer_n, pipe_n, warm_pace_ms, create_pace_ms;
  std::optional<double> sustained_s;
  std::optional<uint64_t> attach_bytes;

  app.add_option("--url", url, "sbxd URL (default $SBX_URL, else http://127.0.0.1:7070)");
  app.add_option("--token", token, "API token (default $SBX_TOKEN)");
  app.add_option("--warm-url", warm_url,
                 "a second sbxd started with a warm pool: create_warm runs against it only");
  app.add_option("--scenarios", scenarios_flag,
                 "comma-separated subset of: create_cold,create_warm,first_output,exec,"
                 "concurrent_create,sustained,attach,density,pause,concurrent_create_warm (default: all)");
  app.add_option("--peers", peers_flag,
                 "comma-separated subset of: fork_exec_true,bwrap_echo,unshare_echo,runc_echo,"
                 "pipe (default: all; \"none\" for none)");
  app.add_flag("--quick", quick,
               "a few iterations of each (CI smoke run: ~5-20, density 20, sustained 5 s, "
               "attach 16 MiB)");
  app.add_flag("--require-peers", require_peers, "fail when a peer's binary is missing");
  app.add_option("--out", out_path, "write the JSON results here");
  app.add_option("--note", extra_notes, "a note for the results' meta block (repeatable)");
  app.add_option("--sbxd-pid", sbxd_pid,
                 "PID of the sbxd at --url: its RSS and memory cgroup, and the CPU time and "
                 "syscalls per operation of create_cold, exec, attach and sustained (perf stat "
                 "on sbxd and what it starts; docs/benchmarks.md)");
  app.add_option("--create-n", create_n, "create_cold iterations (200)");
  app.add_option("--create-pace-ms", create_pace_ms,
                 "create_cold: idle time before each create, after the previous delete (0: back to back)");
  app.add_option("--warm-n", warm_n, "create_warm iterations (200)");
  app.add_option("--warm-pace-ms", warm_pace_ms, "pause between warm creates (30)");
  app.add_option("--first-output-n", first_output_n, "first_output iterations (200)");
  app.add_option("--exec-n", exec_n, "exec iterations (500)");
  app.add_option("--concurrency", concurrency, "concurrent_create: creates at once (50)");
  app.add_option("--concurrent-rounds", rounds, "concurrent_create: rounds (3)");
  app.add_option("--sustained-workers", workers, "sustained: workers (8)");
  app.add_option("--sustained-s", sustained_s, "sustained: seconds (60)");
  app.add_option("--attach-bytes", attach_bytes, "attach: bytes of output (1 GiB)");
  app.add_option("--attach-n", attach_n, "attach: runs (3; 1 with --quick)");
  app.add_option("--density-n", density_n, "density: sandboxes (5000)");
  app.add_option("--density-parallel", density_parallel, "density: creates in flight (4)");
  app.add_option("--pause-n", pause_n, "pause: iterations (50)");
  std::string egress_profile;
  app.add_option("--egress-profile", egress_profile,
                 "create_cold, create_warm, concurrent_create and concurrent_create_warm: create "
                 "with this egress profile (default none; "
                 "the sbxd must have egress on)");
  app.add_option("--peer-n", peer_n, "peers: spawns of each (200)");
  app.add_option("--pipe-n", pipe_n, "pipe peer: runs (3)");
  CLI11_PARSE(app, argc, argv);

  Config cfg;
  if (url.empty()) url = Env("SBX_URL");
  if (url.empty()) url = "http://127.0.0.1:7070";
  if (token.empty()) token = Env("SBX_TOKEN");
  if (token.empty()) {
    fmt::print(stderr, "sbx-load: no API token: pass --token or set SBX_TOKEN\n");
    return 2;
  }
  auto ep = sbx::cli::ParseUrl(url);
  if (!ep.ok()) {
    fmt::print(stderr, "sbx-load: --url: {}\n", std::string(ep.status().message()));
    return 2;
  }
  cfg.endpoint = *ep;
  cfg.token = token;
  cfg.warm_token = token;
  if (!warm_url.empty()) {
    auto wep = sbx::cli::ParseUrl(warm_url);
    if (!wep.ok()) {
      fmt::print(stderr, "sbx-load: --warm-url: {}\n", std::string(wep.status().message()));
      return 2;
    }
    cfg.warm_endpoint = *wep;
  }
  cfg.sbxd_pid = sbxd_pid;
  cfg.quick = quick;
  cfg.egress_profile = egress_profile;
  int peer_iterations = 200, pipe_iterations = 3;
  if (quick) {
    cfg.create_n = cfg.warm_n = cfg.first_output_n = 10;
    cfg.exec_n = 20;
    cfg.concurrency = 20;
    cfg.concurrent_rounds = 1;
    cfg.sustained_s = 5;
    cfg.attach_bytes = 16ull << 20;
    cfg.attach_n = 1;
    cfg.density_n = 20;
    cfg.pause_n = 5;
    peer_iterations = 10;
    pipe_iterations = 1;
  }
  auto apply = [](auto& field, const auto& flag) {
    if (flag) field = *flag;
  };
  apply(cfg.create_n, create_n);
  apply(cfg.create_pace_ms, create_pace_ms);
  apply(cfg.warm_n, warm_n);
  apply(cfg.warm_pace_ms, warm_pace_ms);
  apply(cfg.first_output_n, first_output_n);
  apply(cfg.exec_n, exec_n);
  apply(cfg.concurrency, concurrency);
  apply(cfg.concurrent_rounds, rounds);
  apply(cfg.sustained_workers, workers);
  apply(cfg.sustained_s, sustained_s);
  apply(cfg.attach_bytes, attach_bytes);
  apply(cfg.attach_n, attach_n);
  apply(cfg.density_n, density_n);
  apply(cfg.density_parallel, density_parallel);
  apply(cfg.pause_n, pause_n);
  apply(peer_iterations, peer_n);
  apply(pipe_iterations, pipe_n);

  std::vector<std::string> scenarios =
      scenarios_flag.empty() ? ScenarioNames() : SplitList(scenarios_flag);
  for (const auto& s : scenarios) {
    if (std::find(ScenarioNames().begin(), ScenarioNames().end(), s) == ScenarioNames().end()) {
      fmt::print(stderr, "sbx-load: unknown scenario \"{}\"\n", s);
      return 2;
    }
  }
  std::vector<std::string> peers = peers_flag.empty() ? kPeers : SplitList(peers_flag);
  if (peers_flag == "none") peers.clear();
  cfg.pipe_beside_attach = std::find(peers.begin(), peers.end(), "pipe") != peers.end();
  for (const auto& p : peers) {
    if (std::find(kPeers.begin(), kPeers.end(), p) == kPeers.end()) {
      fmt::print(stderr, "sbx-load: unknown peer \"{}\"\n", p);
      return 2;
    }
  }

  // Fail fast, with the reason, when sbxd is not there at all.
  {
    HttpConn conn(cfg.endpoint, cfg.token);
    auto health = conn.Json("GET", "/v1/sandboxes?limit=1");
    if (!health.ok()) {
      fmt::print(stderr, "sbx-load: sbxd at {} is not usable: {}\n", cfg.endpoint.url,
                 std::string(health.status().message()));
      return 1;
    }
  }

  std::vector<std::string> notes = extra_notes;
  if (quick) notes.push_back("quick mode: a few iterations each; numbers are not comparable");
  nlohmann::json peers_json = nlohmann::json::object();
  bool failed = false;
  // Peers first, so that none of them runs while sbxd still has sandboxes to clean up.
  for (const auto& p : peers) {
    fmt::print("peer {} …\n", p);
    std::fflush(stdout);
    Result r;
    if (p == "fork_exec_true") r = RunSpawnPeer("/bin/true", {"/bin/true"}, "", peer_iterations);
    if (p == "bwrap_echo") r = RunSpawnPeer("bwrap", BwrapEchoArgv(), "hi\n", peer_iterations);
    if (p == "unshare_echo") {
      r = RunSpawnPeer("unshare", UnshareEchoArgv(), "hi\n", peer_iterations);
    }
    if (p == "runc_echo") r = RunRuncPeer(peer_iterations);
    if (p == "pipe") r = RunPipePeer(cfg.attach_bytes, pipe_iterations);
    if (!r.missing.empty() && require_peers) failed = true;
    if (!r.failure.empty() || (r.ran() && r.samples_ms.empty())) failed = true;
    peers_json[p] = ResultToJson(r);
    fmt::print("  {}\n", FormatSummaryLine(p, peers_json[p]));
  }

  nlohmann::json scen_json = nlohmann::json::object();
  for (const auto& s : scenarios) {
    fmt::print("scenario {} …\n", s);
    std::fflush(stdout);
    Results results;
    const auto t0 = Clock::now();
    RunScenario(s, cfg, results);
    for (auto& [name, r] : results) {
      if (!r.failure.empty() || (r.ran() && r.samples_ms.empty())) {
        failed = true;
        if (r.failure.empty()) r.failure = "no iteration succeeded";
      }
      scen_json[name] = ResultToJson(r);
      fmt::print("  {}\n", FormatSummaryLine(name, scen_json[name]));
      for (const auto& m : r.error_messages) fmt::print("    error: {}\n", m);
    }
    fmt::print("  ({:.1f} s)\n", MsBetween(t0, Clock::now()) / 1000.0);
  }
  if (scen_json.contains("create_warm") && scen_json["create_warm"].contains("extra") &&
      scen_json["create_warm"]["extra"].contains("pace_ms")) {
    notes.push_back(fmt::format("create_warm paces creates {} ms apart so the pool can refill",
                                cfg.warm_pace_ms));
  }

  nlohmann::json report;
  report["meta"] = {{"date", UtcNow()},
                    {"host", Hostname()},
                    {"kernel", KernelRelease()},
                    {"cpus", std::thread::hardware_concurrency()},
                    {"commit", GitCommit()},
                    {"mode", quick ? "quick" : "standard"},
                    {"sbxd_url", cfg.endpoint.url},
                    {"warm_url", cfg.warm_endpoint ? cfg.warm_endpoint->url : ""},
                    {"tool", "sbx-load " SBX_VERSION},
                    {"notes", notes}};
  report["scenarios"] = scen_json;
  report["peers"] = peers_json;
  report["ratios"] = BuildRatios(scen_json, peers_json);
  report["targets"] = BuildTargets(scen_json, report["ratios"]);
  report["repeatable"] = BuildRepeatable(scen_json);

  fmt::print("ratios:\n");
  for (const auto& [name, r] : report["ratios"].items()) {
    fmt::print("  {:<26} {:.2f}x\n", name, r["value"].get<double>());
  }
  fmt::print("targets:\n");
  for (const auto& t : report["targets"]) {
    std::string met =
        t["met"].is_null() ? "not measured" : (t["met"].get<bool>() ? "met" : "MISSED");
    std::string measured =
        t["measured"].is_null() ? "-" : fmt::format("{:.2f}", t["measured"].get<double>());
    fmt::print("  {:<46} {} {} {} (measured {}): {}\n", t["name"].get<std::string>(),
               t["op"].get<std::string>(), t["target"].get<double>(),
               t["unit"].get<std::string>(), measured, met);
  }

  // CPU time and syscalls per operation (SbxdMeter): what a loaded CI host cannot skew.
  fmt::print("repeatable forms (sbxd + the processes it started, a metered pass after the timed one):\n");
  fmt::print("  {:<20} {:>12} {:>14} {:>16} {:>14}\n", "scenario", "cpu_ms/op", "syscalls/op",
             "host_cpu_ms/op", "cpu_ns/byte");
  for (const auto& row : report["repeatable"]) {
    auto num = [&](const char* k, int digits) {
      return row.contains(k) && row[k].is_number()
                 ? fmt::format("{:.{}f}", row[k].get<double>(), digits)
                 : std::string("-");
    };
    if (row.contains("cpu_unavailable")) {
      fmt::print("  {:<20} unavailable: {}\n", row["scenario"].get<std::string>(),
                 row["cpu_unavailable"].get<std::string>());
      continue;
    }
    fmt::print("  {:<20} {:>12} {:>14} {:>16} {:>14}\n", row["scenario"].get<std::string>(),
               num("cpu_ms_per_op", 3), num("syscalls_per_op", 1), num("host_cpu_ms_per_op", 3),
               num("cpu_ns_per_byte", 3));
  }

  if (!out_path.empty()) {
    std::ofstream out(out_path, std::ios::trunc);
    out << report.dump(1) << "\n";
    out.close();
    if (!out) {
      fmt::print(stderr, "sbx-load: write {} failed\n", out_path);
      return 1;
    }
    fmt::print("wrote {}\n", out_path);
  }
  if (failed) fmt::print(stderr, "sbx-load: some scenario or peer could not run (see above)\n");
  return failed ? 1 : 0;
}
