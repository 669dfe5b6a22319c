#include "load/scenarios.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "common/status_util.h"
#include "load/api.h"
#include "load/http_conn.h"
#include "load/peers.h"
#include "load/sysinfo.h"

namespace sbx::load {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Sequential scenarios report throughput as 1/mean of the timed step (ops/s if it ran back to
// back); the untimed clean-up between iterations is left out.
void SetSequentialThroughput(Result& r) {
  if (auto s = Summarize(r.samples_ms)) {
    r.throughput = 1000.0 / s->mean;
    r.throughput_unit = "ops/s";
    r.extra["throughput_basis"] = "1000 / mean_ms";
  }
}

// Remembers every sandbox a scenario created and deletes the ones still there when it goes
// out of scope, so that an early return or a failed iteration never leaves sandboxes behind.
class Janitor {
 public:
  Janitor(cli::Endpoint ep, std::string token) : ep_(std::move(ep)), token_(std::move(token)) {}
  ~Janitor() {
    absl::Status s = DeleteAll();
    if (!s.ok()) fmt::print(stderr, "sbx-load: cleanup: {}\n", std::string(s.message()));
  }
  void Add(const std::string& id) {
    std::lock_guard lock(mu_);
    ids_.insert(id);
  }
  void Remove(const std::string& id) {
    std::lock_guard lock(mu_);
    ids_.erase(id);
  }
  absl::Status DeleteAll() {
    std::set<std::string> ids;
    {
      std::lock_guard lock(mu_);
      ids.swap(ids_);
    }
    if (ids.empty()) return absl::OkStatus();
    HttpConn conn(ep_, token_);
    Api api(conn);
    std::vector<std::string> ops;
    absl::Status first = absl::OkStatus();
    for (const auto& id : ids) {
      auto op = api.StartDelete(id);
      if (op.ok()) {
        ops.push_back(*op);
      } else if (first.ok()) {
        first = Annotate(op.status(), fmt::format("delete leftover {}", id));
      }
    }
    for (const auto& op : ops) {
      auto done = api.WaitOperation(op);
      if (!done.ok() && first.ok()) first = done.status();
    }
    return first;
  }

 private:
  cli::Endpoint ep_;
  std::string token_;
  std::mutex mu_;
  std::set<std::string> ids_;
};

// Deletes a sandbox that an iteration created (untimed), counting a failure as an error.
void Cleanup(Api& api, Janitor& janitor, Result& r, const std::string& id) {
  absl::Status s = api.DeleteAndWait(id);
  if (s.ok()) {
    janitor.Remove(id);
  } else {
    r.AddError(fmt::format("clean-up delete {}: {}", id, std::string(s.message())));
  }
}

// The meter (perf stat's syscall tracepoint on sbxd and everything it starts) costs every
// syscall it counts: exec measured 10-15% slower with it on. The peers are timed without one,
// so timed operations run unmetered and the repeatable forms come from a separate pass of
// this many operations after them (fewer when fewer were timed).
constexpr int kMeteredOps = 50;
int MeteredOps(int meter_pid, int timed) {
  return meter_pid > 0 ? std::min(timed, kMeteredOps) : 0;
}

// --- 1. create → running -------------------------------------------------------------------------

// `meter_pid`: the sbxd at `ep` whose CPU time and syscalls are metered (0: none).
Result CreateLoop(const cli::Endpoint& ep, const std::string& token, int n, int pace_ms,
                  bool count_warm, int meter_pid, const std::string& egress_profile) {
  Result r;
  HttpConn conn(ep, token);
  Api api(conn);
  if (absl::Status s = conn.Connect(); !s.ok()) {
    r.failure = Msg(s);
    return r;
  }
  Janitor janitor(ep, token);
  int hits = 0;
  std::vector<double> hit_ms, miss_ms;
  SbxdMeter meter(meter_pid);
  // One untimed iteration first: the first create after start-up pays one-off costs (template
  // preparation, page cache) that are not what a steady client sees.
  nlohmann::json body = {{"template", "base"}};
  if (!egress_profile.empty()) body["egress_profile"] = egress_profile;
  const int metered = MeteredOps(meter_pid, n);
  for (int i = -1; i < n + metered; ++i) {
    const bool timed = i >= 0 && i < n;  // the rest (i >= n) are metered, not timed
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
    if (i >= n) meter.Begin();
    const auto t0 = Clock::now();
    auto c = api.CreateSandbox(body);
    if (!c.ok()) {
      if (i >= n) meter.End(0);
      r.AddError(Msg(c.status()));
      continue;
    }
    janitor.Add(c->sandbox_id);
    auto op = api.WaitOperation(c->operation_id);
    const auto t1 = Clock::now();
    if (i >= n) meter.End(op.ok() ? 1 : 0);
    if (!op.ok()) {
      r.AddError(Msg(op.status()));
    } else if (timed) {
      double ms = MsBetween(t0, t1);
      r.samples_ms.push_back(ms);
      bool warm = c->warm_pool || (op->contains("result") && (*op)["result"].is_object() &&
                                   (*op)["result"].value("warm_pool", false));
      if (warm) {
        ++hits;
        hit_ms.push_back(ms);
      } else {
        miss_ms.push_back(ms);
      }
    }
    Cleanup(api, janitor, r, c->sandbox_id);
  }
  SetSequentialThroughput(r);
  r.extra["warmup_iterations"] = 1;
  if (!egress_profile.empty()) r.extra["egress_profile"] = egress_profile;
  if (meter_pid > 0) meter.AddTo(r.extra);
  if (count_warm) {
    r.extra["warm_pool_hits"] = hits;
    r.extra["pace_ms"] = pace_ms;
    if (auto s = Summarize(hit_ms)) r.extra["p50_ms_pool_hits"] = Round(s->p50);
    if (auto s = Summarize(miss_ms)) r.extra["p50_ms_pool_misses"] = Round(s->p50);
  }
  return r;
}

void CreateCold(const Config& cfg, Results& out) {
  out["create_cold"] = CreateLoop(cfg.endpoint, cfg.token, cfg.create_n, cfg.create_pace_ms, false,
                                 cfg.sbxd_pid, cfg.egress_profile);
  if (cfg.create_pace_ms > 0) out["create_cold"].extra["pace_ms"] = cfg.create_pace_ms;
}

void CreateWarm(const Config& cfg, Results& out) {
  if (!cfg.warm_endpoint) {
    Result r;
    r.skipped = "no --warm-url (an sbxd started with a warm pool)";
    out["create_warm"] = std::move(r);
    return;
  }
  Result r = CreateLoop(*cfg.warm_endpoint, cfg.warm_token, cfg.warm_n, cfg.warm_pace_ms, true, 0,
                        cfg.egress_profile);
  r.extra["sbxd_url"] = cfg.warm_endpoint->url;
  out["create_warm"] = std::move(r);
}

// --- 2. create → first stdout byte of `echo hi` → exit -------------------------------------------

void FirstOutput(const Config& cfg, Results& out) {
  Result first, exit;
  HttpConn conn(cfg.endpoint, cfg.token);
  Api api(conn);
  if (absl::Status s = conn.Connect(); !s.ok()) {
    first.failure = exit.failure = Msg(s);
    out["first_output"] = first;
    out["first_output_exit"] = exit;
    return;
  }
  Janitor janitor(cfg.endpoint, cfg.token);
  std::vector<double> running_ms;
  for (int i = -1; i < cfg.first_output_n; ++i) {
    const auto t0 = Clock::now();
    auto c = api.CreateSandbox();
    if (!c.ok()) {
      first.AddError(Msg(c.status()));
      continue;
    }
    janitor.Add(c->sandbox_id);
    absl::StatusOr<AttachResult> a = [&]() -> absl::StatusOr<AttachResult> {
      SBX_RETURN_IF_ERROR(api.WaitOperation(c->operation_id).status());
      if (i >= 0) running_ms.push_back(MsBetween(t0, Clock::now()));
      return api.Exec(c->sandbox_id, {"echo", "hi"});
    }();
    if (!a.ok()) {
      first.AddError(Msg(a.status()));
    } else if (a->stdout_head != "hi\n" || !a->first_stdout) {
      first.AddError(fmt::format("echo hi in {}: stdout was \"{}\"", c->sandbox_id,
                                 a->stdout_head.substr(0, 100)));
    } else if (i >= 0) {
      first.samples_ms.push_back(MsBetween(t0, *a->first_stdout));
      exit.samples_ms.push_back(MsBetween(t0, a->exited));
    }
    Cleanup(api, janitor, first, c->sandbox_id);
  }
  exit.errors = first.errors;  // the same iterations: an error is one for both
  SetSequentialThroughput(first);
  SetSequentialThroughput(exit);
  first.extra["warmup_iterations"] = 1;
  if (auto s = Summarize(running_ms)) first.extra["p50_ms_create_to_running"] = Round(s->p50);
  out["first_output"] = std::move(first);
  out["first_output_exit"] = std::move(exit);
}

// --- 3. exec in a running sandbox ----------------------------------------------------------------

void Exec(const Config& cfg, Results& out) {
  Result r;
  HttpConn conn(cfg.endpoint, cfg.token);
  Api api(conn);
  Janitor janitor(cfg.endpoint, cfg.token);
  // Before the sandbox exists, so that its agent is among the processes metered.
  SbxdMeter meter(cfg.sbxd_pid);
  auto c = api.CreateRunning();
  if (!c.ok()) {
    r.failure = fmt::format("create the sandbox: {}", std::string(c.status().message()));
    out["exec"] = std::move(r);
    return;
  }
  janitor.Add(c->sandbox_id);
  // The two forms a client can use alternate, so that both see the same machine: `exec` is
  // what `sbx exec` sends (one request), `exec_split` the create, then the attach.
  Result split;
  const int n = cfg.exec_n;
  const int metered = MeteredOps(cfg.sbxd_pid, n);
  for (int i = -1; i < n + metered; ++i) {
    if (i >= n) meter.Begin();
    const auto t0 = Clock::now();
    auto a = api.Exec(c->sandbox_id, {"true"});
    const auto t1 = Clock::now();
    if (i >= n) meter.End(a.ok() ? 1 : 0);
    if (!a.ok()) {
      r.AddError(Msg(a.status()));
    } else if (i >= 0 && i < n) {
      r.samples_ms.push_back(MsBetween(t0, t1));
    }
    if (i >= n) continue;
    const auto t2 = Clock::now();
    auto b = api.Exec(c->sandbox_id, {"true"}, /*binary=*/false, Api::ExecForm::kTwoRequests);
    const auto t3 = Clock::now();
    if (!b.ok()) {
      split.AddError(Msg(b.status()));
    } else if (i >= 0) {
      split.samples_ms.push_back(MsBetween(t2, t3));
    }
  }
  SetSequentialThroughput(r);
  SetSequentialThroughput(split);
  r.extra["warmup_iterations"] = 1;
  split.extra["warmup_iterations"] = 1;
  r.extra["steps"] = "POST session?attach=true [\"true\"], its stream until process_exited";
  split.extra["steps"] = "POST session [\"true\"] + GET attach until process_exited";
  if (cfg.sbxd_pid > 0) meter.AddTo(r.extra);
  Cleanup(api, janitor, r, c->sandbox_id);
  out["exec"] = std::move(r);
  out["exec_split"] = std::move(split);
}

// --- 4a. concurrent creates ----------------------------------------------------------------------

// `settle_ms` before each round lets a warm pool refill after the previous burst.
Result ConcurrentCreateOn(const Config& cfg, const cli::Endpoint& endpoint, const std::string& token,
                          int settle_ms) {
  Result r;
  const int n = cfg.concurrency;
  int warm_hits = 0;
  Janitor janitor(endpoint, token);
  std::mutex mu;
  std::vector<double> round_wall_ms;
  std::vector<Clock::time_point> done(n);
  Clock::time_point start;
  // Phase 1 of each round: every thread creates at once; phase 2: they delete (untimed) only
  // after all creates are done, so that no delete overlaps a measured create.
  std::barrier sync(n);
  std::barrier go(n, [&]() noexcept { start = Clock::now(); });
  nlohmann::json body = {{"template", "base"}};
  if (!cfg.egress_profile.empty()) {
    body["egress_profile"] = cfg.egress_profile;
    r.extra["egress_profile"] = cfg.egress_profile;
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      HttpConn conn(endpoint, token);
      Api api(conn);
      absl::Status connected = conn.Connect();
      for (int round = 0; round < cfg.concurrent_rounds; ++round) {
        if (settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
        go.arrive_and_wait();
        std::optional<std::string> id;
        const auto t0 = Clock::now();
        absl::StatusOr<Created> c = connected.ok() ? api.CreateSandbox(body) : connected;
        if (c.ok()) {
          janitor.Add(c->sandbox_id);
          id = c->sandbox_id;
          if (absl::Status s = api.WaitOperation(c->operation_id).status(); !s.ok()) c = s;
        }
        const auto t1 = Clock::now();
        {
          std::lock_guard lock(mu);
          done[t] = t1;
          if (c.ok()) {
            r.samples_ms.push_back(MsBetween(t0, t1));
            if (c->warm_pool) ++warm_hits;
          } else {
            r.AddError(Msg(c.status()));
          }
        }
        sync.arrive_and_wait();
        if (t == 0) {
          std::lock_guard lock(mu);
          round_wall_ms.push_back(MsBetween(start, *std::max_element(done.begin(), done.end())));
        }
        if (id) {
          absl::Status s = api.DeleteAndWait(*id);
          std::lock_guard lock(mu);
          if (s.ok()) {
            janitor.Remove(*id);
          } else {
            r.AddError(fmt::format("clean-up delete {}: {}", *id, std::string(s.message())));
          }
        }
        sync.arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
  if (auto s = Summarize(round_wall_ms); s && !r.samples_ms.empty()) {
    r.throughput = static_cast<double>(n) / (s->mean / 1000.0);
    r.throughput_unit = "creates/s";
    r.extra["throughput_basis"] = "concurrency / mean round wall time";
  }
  r.extra["concurrency"] = n;
  r.extra["rounds"] = cfg.concurrent_rounds;
  nlohmann::json walls = nlohmann::json::array();
  for (double w : round_wall_ms) walls.push_back(Round(w));
  r.extra["round_wall_ms"] = walls;
  r.extra["warm_pool_hits"] = warm_hits;
  return r;
}

void ConcurrentCreate(const Config& cfg, Results& out) {
  out["concurrent_create"] = ConcurrentCreateOn(cfg, cfg.endpoint, cfg.token, 0);
}

// The same burst against the sbxd with a warm pool (sized for the burst by tools/bench.sh).
void ConcurrentCreateWarm(const Config& cfg, Results& out) {
  if (!cfg.warm_endpoint) {
    Result r;
    r.skipped = "no --warm-url (an sbxd started with a warm pool)";
    out["concurrent_create_warm"] = std::move(r);
    return;
  }
  constexpr int kSettleMs = 3000;
  Result r = ConcurrentCreateOn(cfg, *cfg.warm_endpoint, cfg.warm_token, kSettleMs);
  r.extra["settle_ms_before_each_round"] = kSettleMs;
  r.extra["sbxd_url"] = cfg.warm_endpoint->url;
  out["concurrent_create_warm"] = std::move(r);
}

// --- 4b. sustained create + exec + delete --------------------------------------------------------

// Workers loop create → exec → delete until `seconds` have passed; each completed cycle's time
// goes to `cycles_ms`, failures to r's errors.
void SustainedWindow(const Config& cfg, double seconds, Janitor& janitor, Result& r,
                     std::vector<double>& cycles_ms) {
  std::mutex mu;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  for (int w = 0; w < cfg.sustained_workers; ++w) {
    threads.emplace_back([&] {
      HttpConn conn(cfg.endpoint, cfg.token);
      Api api(conn);
      while (Clock::now() < deadline) {
        const auto t0 = Clock::now();
        auto c = api.CreateSandbox();
        if (!c.ok()) {
          std::lock_guard lock(mu);
          r.AddError(Msg(c.status()));
          continue;
        }
        janitor.Add(c->sandbox_id);
        absl::Status s = api.WaitOperation(c->operation_id).status();
        if (s.ok()) s = api.Exec(c->sandbox_id, {"true"}).status();
        absl::Status d = api.DeleteAndWait(c->sandbox_id);
        const auto t1 = Clock::now();
        if (d.ok()) janitor.Remove(c->sandbox_id);
        std::lock_guard lock(mu);
        if (!s.ok()) {
          r.AddError(Msg(s));
        } else if (!d.ok()) {
          r.AddError(fmt::format("delete {}: {}", c->sandbox_id, std::string(d.message())));
        } else {
          cycles_ms.push_back(MsBetween(t0, t1));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
}

void Sustained(const Config& cfg, Results& out) {
  Result r;
  Janitor janitor(cfg.endpoint, cfg.token);
  SbxdMeter meter(cfg.sbxd_pid);
  const auto start = Clock::now();
  SustainedWindow(cfg, cfg.sustained_s, janitor, r, r.samples_ms);
  const double wall_s = MsBetween(start, Clock::now()) / 1000.0;
  if (cfg.sbxd_pid > 0) {
    // The repeatable form from a window of its own (up to 10 s), divided by its cycles.
    const double metered_s = std::min(cfg.sustained_s, 10.0);
    std::vector<double> metered;
    meter.Begin();
    SustainedWindow(cfg, metered_s, janitor, r, metered);
    meter.End(static_cast<double>(metered.size()));
    meter.AddTo(r.extra);
    r.extra["metered_window_s"] = Round(metered_s, 2);
  }
  r.throughput = static_cast<double>(r.samples_ms.size()) / wall_s;
  r.throughput_unit = "cycles/s";
  r.extra["workers"] = cfg.sustained_workers;
  r.extra["duration_s"] = Round(wall_s, 2);
  r.extra["cycle"] = "create → running → session [\"true\"] + attach → delete → deleted";
  out["sustained"] = std::move(r);
}

// --- 5. attach throughput ------------------------------------------------------------------------

void Attach(const Config& cfg, Results& out, bool binary) {
  const std::string name = binary ? "attach_binary" : "attach";
  Result r;
  HttpConn conn(cfg.endpoint, cfg.token);
  Api api(conn);
  Janitor janitor(cfg.endpoint, cfg.token);
  SbxdMeter meter(cfg.sbxd_pid);  // before the sandbox, so that its agent is metered
  auto c = api.CreateRunning();
  if (!c.ok()) {
    r.failure = fmt::format("create the sandbox: {}", std::string(c.status().message()));
    out[name] = std::move(r);
    return;
  }
  janitor.Add(c->sandbox_id);
  const std::vector<std::string> argv = {"head", "-c", std::to_string(cfg.attach_bytes),
                                         "/dev/zero"};
  nlohmann::json rates = nlohmann::json::array();
  std::vector<double> pipe_ms;
  auto pipe_run = [&] {
    if (!cfg.pipe_beside_attach) return;
    Result p = RunPipePeer(cfg.attach_bytes, 1);
    for (double ms : p.samples_ms) pipe_ms.push_back(ms);
    for (const auto& m : p.error_messages) r.AddError("pipe peer beside: " + m);
  };
  // The timed runs, each after a run of the pipe peer, one more of it after the last, then
  // one metered run (its rate is not among the samples).
  const int metered = MeteredOps(cfg.sbxd_pid, 1);
  for (int i = 0; i < cfg.attach_n + metered; ++i) {
    const bool timed = i < cfg.attach_n;
    if (timed) pipe_run();
    if (i == cfg.attach_n) pipe_run();
    if (!timed) meter.Begin();
    auto a = api.Exec(c->sandbox_id, argv, binary);
    if (!timed) meter.End(a.ok() ? 1 : 0, a.ok() ? static_cast<double>(a->stdout_bytes) : 0);
    if (!a.ok()) {
      r.AddError(Msg(a.status()));
      continue;
    }
    if (a->stdout_bytes != cfg.attach_bytes || !a->first_stdout) {
      r.AddError(fmt::format("received {} bytes of stdout, expected {}", a->stdout_bytes,
                             cfg.attach_bytes));
      continue;
    }
    if (!timed) continue;
    double ms = MsBetween(*a->first_stdout, a->exited);
    r.samples_ms.push_back(ms);
    rates.push_back(Round(static_cast<double>(cfg.attach_bytes) / 1e6 / (ms / 1000.0), 1));
  }
  if (auto s = Summarize(r.samples_ms)) {
    r.throughput = static_cast<double>(cfg.attach_bytes) / 1e6 / (s->p50 / 1000.0);
    r.throughput_unit = "MB/s";
    r.extra["throughput_basis"] = "bytes / p50 time from the first stdout byte to process_exited";
  }
  if (cfg.attach_n > 0 && metered == 0) pipe_run();  // the run after the last timed one
  if (auto p = Summarize(pipe_ms)) {
    r.extra["pipe_beside_ms"] = pipe_ms;
    r.extra["pipe_beside_mb_s"] = Round(static_cast<double>(cfg.attach_bytes) / 1e6 / (p->p50 / 1000.0), 1);
  }
  r.extra["bytes"] = cfg.attach_bytes;
  r.extra["mb_per_s"] = rates;
  r.extra["command"] = fmt::format("head -c {} /dev/zero", cfg.attach_bytes);
  if (cfg.sbxd_pid > 0) meter.AddTo(r.extra);
  r.extra["form"] = binary ? "binary (?format=binary)" : "SSE";
  Cleanup(api, janitor, r, c->sandbox_id);
  out[name] = std::move(r);
}

// --- 6. density ----------------------------------------------------------------------------------

void Density(const Config& cfg, Results& out) {
  Result r;
  Janitor janitor(cfg.endpoint, cfg.token);
  std::mutex mu;
  std::vector<std::string> ids;
  std::vector<std::string> notes;

  std::optional<uint64_t> sbxd_rss_before;
  if (cfg.sbxd_pid > 0) {
    if (auto v = ProcessRssBytes(cfg.sbxd_pid); v.ok()) sbxd_rss_before = *v;
  }
  auto avail_before = MemAvailableBytes();
  // Kernel memory the sandboxes do not see in their cgroups: unreclaimable slab (the memcg
  // shrinker maps grow as the square of the count, docs/doctor.md "Density").
  auto sunreclaim_before = MeminfoBytes("SUnreclaim");
  std::optional<size_t> sbxd_fds_before;
  if (cfg.sbxd_pid > 0) {
    if (auto n = OpenFds(cfg.sbxd_pid); n.ok()) sbxd_fds_before = *n;
  }

  const auto fill_start = Clock::now();
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < std::max(1, cfg.density_parallel); ++t) {
    threads.emplace_back([&] {
      HttpConn conn(cfg.endpoint, cfg.token);
      Api api(conn);
      int consecutive_errors = 0;
      // A server that refuses sandboxes (limits, exhaustion) stops the fill rather than
      // grinding through hundreds of failing requests.
      while (next.fetch_add(1) < cfg.density_n && consecutive_errors < 10) {
        const auto t0 = Clock::now();
        auto c = api.CreateSandbox();
        if (c.ok()) janitor.Add(c->sandbox_id);
        absl::Status s = c.ok() ? api.WaitOperation(c->operation_id).status() : c.status();
        std::lock_guard lock(mu);
        if (c.ok()) ids.push_back(c->sandbox_id);
        if (s.ok()) {
          r.samples_ms.push_back(MsBetween(t0, Clock::now()));
          consecutive_errors = 0;
        } else {
          r.AddError(Msg(s));
          ++consecutive_errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  threads.clear();
  const double fill_s = MsBetween(fill_start, Clock::now()) / 1000.0;
  const size_t running = r.samples_ms.size();
  r.extra["requested"] = cfg.density_n;
  r.extra["running"] = running;
  r.extra["fill_s"] = Round(fill_s, 2);
  r.extra["fill_parallelism"] = cfg.density_parallel;
  if (fill_s > 0) r.extra["fill_per_s"] = Round(static_cast<double>(running) / fill_s, 1);

  if (running > 0) {
    // Host view: everything the sandboxes cost the machine, kernel objects included.
    auto avail_after = MemAvailableBytes();
    if (avail_before.ok() && avail_after.ok()) {
      double per = (static_cast<double>(*avail_before) - static_cast<double>(*avail_after)) /
                   static_cast<double>(running) / kMiB;
      r.extra["host_mem_per_sandbox_mib"] = Round(per, 3);
      r.extra["mem_available_before_mib"] = Round(static_cast<double>(*avail_before) / kMiB, 1);
      r.extra["mem_available_after_mib"] = Round(static_cast<double>(*avail_after) / kMiB, 1);
    } else {
      notes.push_back("MemAvailable unreadable");
    }
    auto sunreclaim_after = MeminfoBytes("SUnreclaim");
    if (sunreclaim_before.ok() && sunreclaim_after.ok()) {
      const double grew =
          static_cast<double>(*sunreclaim_after) - static_cast<double>(*sunreclaim_before);
      r.extra["slab_unreclaimable_growth_mib"] = Round(grew / kMiB, 1);
      r.extra["slab_unreclaimable_per_sandbox_mib"] =
          Round(grew / static_cast<double>(running) / kMiB, 3);
    }
    if (cfg.sbxd_pid > 0) {
      if (auto n = OpenFds(cfg.sbxd_pid); n.ok()) {
        r.extra["sbxd_fds"] = *n;
        if (sbxd_fds_before) r.extra["sbxd_fds_before"] = *sbxd_fds_before;
      }
    }
    if (cfg.sbxd_pid > 0) {
      auto cg = MemoryCgroupOf(cfg.sbxd_pid);
      if (!cg.ok()) {
        notes.push_back(
            fmt::format("no cgroup accounting: {}", std::string(cg.status().message())));
      } else {
        uint64_t cg_sum = 0, rss_sum = 0;
        size_t measured = 0, agents = 0;
        for (const auto& id : ids) {
          std::string dir = fmt::format("{}/sbx/{}", cg->dir, id);
          auto usage = ReadFile(dir + "/" + cg->usage_file);
          if (!usage.ok()) continue;
          cg_sum += std::strtoull(usage->c_str(), nullptr, 10);
          ++measured;
          // The agent lives in <id>/agent, the workload in <id>/work (docs/isolation.md).
          for (const char* sub : {"", "/agent", "/work"}) {
            for (int pid : CgroupPids(dir + sub)) {
              if (auto rss = ProcessRssBytes(pid); rss.ok()) {
                rss_sum += *rss;
                ++agents;
              }
            }
          }
        }
        r.extra["memory_cgroup_parent"] = cg->dir + "/sbx";
        r.extra["cgroups_measured"] = measured;
        if (measured > 0) {
          r.extra["cgroup_mem_per_sandbox_mib"] =
              Round(static_cast<double>(cg_sum) / static_cast<double>(measured) / kMiB, 3);
          r.extra["agent_rss_per_sandbox_mib"] =
              Round(static_cast<double>(rss_sum) / static_cast<double>(measured) / kMiB, 3);
          r.extra["processes_per_sandbox"] =
              Round(static_cast<double>(agents) / static_cast<double>(measured), 2);
        } else {
          notes.push_back(fmt::format("no sandbox cgroup found under {}/sbx", cg->dir));
        }
      }
      if (auto rss = ProcessRssBytes(cfg.sbxd_pid); rss.ok()) {
        r.extra["sbxd_rss_mib"] = Round(static_cast<double>(*rss) / kMiB, 2);
        if (sbxd_rss_before) {
          r.extra["sbxd_rss_before_mib"] = Round(static_cast<double>(*sbxd_rss_before) / kMiB, 2);
        }
      } else {
        notes.push_back(fmt::format("sbxd RSS: {}", std::string(rss.status().message())));
      }
    } else {
      notes.push_back("no --sbxd-pid: cgroup accounting and sbxd RSS not measured");
    }
  }

  // Delete them all at once: each thread issues its share of DELETEs, then waits for them.
  const auto del_start = Clock::now();
  std::vector<double> delete_ms;
  const int del_threads = 8;
  for (int t = 0; t < del_threads; ++t) {
    threads.emplace_back([&, t] {
      HttpConn conn(cfg.endpoint, cfg.token);
      Api api(conn);
      std::vector<std::pair<std::string, std::string>> ops;  // sandbox, operation
      for (size_t i = static_cast<size_t>(t); i < ids.size(); i += del_threads) {
        auto op = api.StartDelete(ids[i]);
        if (op.ok()) {
          ops.emplace_back(ids[i], *op);
        } else {
          std::lock_guard lock(mu);
          r.AddError(fmt::format("delete {}: {}", ids[i], std::string(op.status().message())));
        }
      }
      for (const auto& [id, op] : ops) {
        absl::Status s = api.WaitOperation(op).status();
        std::lock_guard lock(mu);
        if (s.ok()) {
          janitor.Remove(id);
          delete_ms.push_back(MsBetween(del_start, Clock::now()));
        } else {
          r.AddError(fmt::format("delete {}: {}", id, std::string(s.message())));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const double del_wall = MsBetween(del_start, Clock::now());
  if (!delete_ms.empty()) {
    r.extra["delete_all_ms"] = Round(del_wall, 1);
    r.extra["deleted"] = delete_ms.size();
    r.throughput = static_cast<double>(delete_ms.size()) / (del_wall / 1000.0);
    r.throughput_unit = "deletes/s";
    r.extra["throughput_basis"] = "sandboxes deleted / wall time to delete them all";
  }
  r.extra["samples"] = "create → running while filling";
  if (!notes.empty()) r.extra["notes"] = notes;
  if (running == 0) r.failure = "no sandbox could be created";
  out["density"] = std::move(r);
}

// --- 7. pause → wake → delete --------------------------------------------------------------------

void Pause(const Config& cfg, Results& out) {
  Result pause, wake, del;
  HttpConn conn(cfg.endpoint, cfg.token);
  Api api(conn);
  Janitor janitor(cfg.endpoint, cfg.token);
  std::string no_pause;
  // Starts a lifecycle operation and waits for it: the time from the POST to `succeeded`.
  auto timed_op = [&](const std::string& id, const char* verb) -> absl::StatusOr<double> {
    const auto t0 = Clock::now();
    SBX_ASSIGN_OR_RETURN(HttpResponse res,
                         conn.Call("POST", fmt::format("/v1/sandboxes/{}/{}", id, verb)));
    if (res.status != 202 && res.status != 200) {
      return Annotate(res.AsError(), fmt::format("POST /v1/sandboxes/{}/{}", id, verb));
    }
    nlohmann::json j = nlohmann::json::parse(res.body, nullptr, false);
    if (!j.is_object() || !j.contains("operation") || !j["operation"].contains("id")) {
      return absl::InternalError(fmt::format("{} {}: no operation in the response", verb, id));
    }
    SBX_RETURN_IF_ERROR(api.WaitOperation(j["operation"]["id"].get<std::string>()).status());
    return MsBetween(t0, Clock::now());
  };
  for (int i = 0; i < cfg.pause_n; ++i) {
    auto c = api.CreateRunning();
    if (!c.ok()) {
      pause.AddError(Msg(c.status()));
      continue;
    }
    janitor.Add(c->sandbox_id);
    if (no_pause.empty()) {
      // Probe: an sbxd without the pause routes answers 404 (unknown route) or 501.
      const auto t0 = Clock::now();
      auto res = conn.Call("POST", fmt::format("/v1/sandboxes/{}/pause", c->sandbox_id));
      if (!res.ok()) {
        pause.AddError(Msg(res.status()));
      } else if (res->status == 404 || res->status == 501) {
        no_pause = fmt::format("server has no pause (POST …/pause answered {})", res->status);
      } else if (res->status != 202 && res->status != 200) {
        pause.AddError(Msg(res->AsError()));
      } else {
        nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
        absl::Status s = j.is_object() && j.contains("operation")
                             ? api.WaitOperation(j["operation"].value("id", "")).status()
                             : absl::InternalError("pause: no operation in the response");
        if (s.ok()) {
          pause.samples_ms.push_back(MsBetween(t0, Clock::now()));
          auto w = timed_op(c->sandbox_id, "wake");
          if (w.ok()) {
            wake.samples_ms.push_back(*w);
            // The woken sandbox must run commands again; untimed.
            if (auto e = api.Exec(c->sandbox_id, {"true"}); !e.ok()) {
              wake.AddError(fmt::format("exec after wake: {}", std::string(e.status().message())));
            }
          } else {
            wake.AddError(Msg(w.status()));
          }
        } else {
          pause.AddError(Msg(s));
        }
      }
    }
    const auto t0 = Clock::now();
    absl::Status d = api.DeleteAndWait(c->sandbox_id);
    if (d.ok()) {
      del.samples_ms.push_back(MsBetween(t0, Clock::now()));
      janitor.Remove(c->sandbox_id);
    } else {
      del.AddError(Msg(d));
    }
  }
  if (!no_pause.empty()) {
    pause.skipped = wake.skipped = no_pause;
    del.extra["note"] = "sandboxes were not paused: delete of a running sandbox";
  } else {
    del.extra["note"] = "delete of a sandbox that was paused and woken";
  }
  SetSequentialThroughput(pause);
  SetSequentialThroughput(wake);
  SetSequentialThroughput(del);
  out["pause"] = std::move(pause);
  out["pause_wake"] = std::move(wake);
  out["pause_delete"] = std::move(del);
}

}  // namespace

const std::vector<std::string>& ScenarioNames() {
  static const std::vector<std::string> kNames = {
      "create_cold", "create_warm", "first_output", "exec",  "concurrent_create",
      "sustained",   "attach",      "attach_binary", "density",
      "pause",       "concurrent_create_warm"};
  return kNames;
}

void RunScenario(const std::string& name, const Config& cfg, Results& out) {
  if (name == "create_cold") return CreateCold(cfg, out);
  if (name == "create_warm") return CreateWarm(cfg, out);
  if (name == "first_output") return FirstOutput(cfg, out);
  if (name == "exec") return Exec(cfg, out);
  if (name == "concurrent_create") return ConcurrentCreate(cfg, out);
  if (name == "concurrent_create_warm") return ConcurrentCreateWarm(cfg, out);
  if (name == "sustained") return Sustained(cfg, out);
  if (name == "attach") return Attach(cfg, out, /*binary=*/false);
  if (name == "attach_binary") return Attach(cfg, out, /*binary=*/true);
  if (name == "density") return Density(cfg, out);
  if (name == "pause") return Pause(cfg, out);
  Result r;
  r.failure = fmt::format("unknown scenario {}", name);
  out[name] = std::move(r);
}

}  // namespace sbx::load
