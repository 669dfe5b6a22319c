// sbxd: wires the store, the runtimes, the operation engine, the service and the HTTP API, then
// waits for SIGTERM/SIGINT. Sandboxes outlive this process: stopping sbxd stops the API only,
// and the next start re-adopts what is still running.
#include <charconv>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "api/api.h"
#include "api/status_to_http.h"
#include "common/ids.h"
#include "common/status_util.h"
#include "daemon/preflight.h"
#include "daemon/state_files.h"
#include "http/server.h"
#include "ops/operation_engine.h"
#include "runtime/fake/fake_backend.h"
#include "runtime/ns/ns_backend.h"
#include "runtime/ns/seccomp.h"
#include "service/sandbox_service.h"
#include "service/templates.h"
#include "store/sqlite_store.h"

namespace {

namespace fs = std::filesystem;

struct Flags {
  std::string listen = "127.0.0.1:7070";
  std::string state_dir = "/var/lib/sbx";
  std::string admin_token;
  std::string runtime = "ns";
  std::string agent_path;
  std::string log_level = "info";
  int workers = 4;
  int http_threads = 2;
  size_t buffer_bytes = 8 << 20;
  bool cgroup_favor_dynmods = true;
  std::vector<std::string> warm_pools = {"base=2"};
  int netns_pool = 4;
  int disk_pool = 2;
  int userns_pool = 4;
  bool userns = true;
  std::string seccomp_policy;  // empty: the policy embedded at build time
  bool check = false;          // --check: run the host preflight, print it, exit
  bool check_json = false;
  // Deployment-wide limits of every sandbox (runtime::Resources; not requestable).
  int default_pids = sbx::runtime::Resources{}.pids;
  int default_open_files = sbx::runtime::Resources{}.open_files;
  int tmp_mib = sbx::runtime::Resources{}.tmp_mib;
  int shm_mib = sbx::runtime::Resources{}.shm_mib;
};

// Range checks with messages that name the flag; run before the runtime touches the host.
absl::Status CheckFlagRange(const char* flag, int64_t v, int64_t lo, int64_t hi,
                            const char* why) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("{} {}: must be between {} and {} ({})", flag, v, lo, hi, why));
}

// A sandbox cannot get more open files than sbxd's own hard RLIMIT_NOFILE: raising a hard limit
// needs CAP_SYS_RESOURCE, which root lacks on some hosts (20000 on the project's machines).
// Clamped with a warning rather than refused, so the default works on such hosts.
int ClampOpenFiles(int wanted) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("--default-open-files: getrlimit(RLIMIT_NOFILE): {}; keeping {}",
                 sbx::ErrnoMessage(errno), wanted);
    return wanted;
  }
  if (rl.rlim_max != RLIM_INFINITY && static_cast<rlim_t>(wanted) > rl.rlim_max) {
    spdlog::warn("--default-open-files {} exceeds sbxd's hard RLIMIT_NOFILE {}, which cannot be "
                 "raised here; sandboxes get {}",
                 wanted, static_cast<uint64_t>(rl.rlim_max), static_cast<uint64_t>(rl.rlim_max));
    return static_cast<int>(rl.rlim_max);
  }
  return wanted;
}

// "TEMPLATE=N" -> a pool of N ready sandboxes of TEMPLATE on the default runtime.
absl::StatusOr<sbx::service::WarmPoolConfig> ParseWarmPool(const std::string& spec,
                                                          const std::string& runtime) {
  auto eq = spec.find('=');
  sbx::service::WarmPoolConfig c;
  c.runtime = runtime;
  c.template_name = spec.substr(0, eq);
  int n = -1;
  if (eq != std::string::npos) {
    const char* b = spec.data() + eq + 1;
    const char* e = spec.data() + spec.size();
    auto [p, ec] = std::from_chars(b, e, n);
    if (ec != std::errc() || p != e) n = -1;
  }
  if (c.template_name.empty() || n < 0 || n > 256) {
    return absl::InvalidArgumentError(
        fmt::format("--warm-pool '{}': expected TEMPLATE=N with N from 0 to 256", spec));
  }
  c.size = n;
  return c;
}

std::string DefaultAgentPath() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "sbx-agent";
  return (self.parent_path() / "sbx-agent").string();
}

absl::StatusOr<std::pair<std::string, uint16_t>> SplitListen(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        fmt::format("--listen '{}': expected HOST:PORT, e.g. 127.0.0.1:7070", listen));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(fmt::format("--listen '{}': bad port", listen));
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

int Fail(const absl::Status& s) {
  spdlog::critical("sbxd: {}", std::string(s.message()));
  std::fprintf(stderr, "sbxd: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"sbxd: runs untrusted code in isolated sandboxes behind an HTTP API"};
  app.add_option("--listen", f.listen, "HOST:PORT to serve the API on (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--state-dir", f.state_dir, "where the database, tokens and sandboxes live")
      ->capture_default_str();
  app.add_option("--admin-token", f.admin_token,
                 "admin token (default: $SBX_ADMIN_TOKEN, else generated into "
                 "STATE_DIR/admin-token)");
  app.add_option("--runtime", f.runtime, "default runtime: ns (namespaces) or fake (no isolation, "
                                         "tests only)")
      ->capture_default_str();
  app.add_option("--agent-path", f.agent_path, "sbx-agent binary (default: beside sbxd)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--workers", f.workers, "threads running lifecycle operations")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--http-threads", f.http_threads, "threads serving HTTP")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--output-buffer-bytes", f.buffer_bytes,
                 "output retained per session stream by the agent")
      ->capture_default_str()
      ->check(CLI::Range(size_t{64 << 10}, size_t{1} << 30));
  app.add_option("--cgroup-favor-dynmods", f.cgroup_favor_dynmods,
                 "on hybrid cgroup v1/v2 hosts, remount the host's cgroup2 with favordynmods so "
                 "that joining a sandbox's cgroups skips an RCU grace period (host-wide; "
                 "false leaves the host's mount alone)")
      ->capture_default_str();
  app.add_option("--netns-pool", f.netns_pool,
                 "network namespaces (lo up) kept ready for launches by an idle-priority thread; "
                 "0 creates each one during the launch")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--disk-pool", f.disk_pool,
                 "sandbox disks (ext4 images of the default disk_mib, loop-mounted) kept ready by "
                 "an idle-priority thread; 0 makes each one during the launch")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--userns-pool", f.userns_pool,
                 "uid ranges claimed and user namespaces built ahead by an idle-priority thread; 0 "
                 "builds each one during the launch")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--userns", f.userns,
                 "run each sandbox in its own user namespace and host uid range (false only for "
                 "hosts whose state dir file system cannot be idmapped: sandbox root is then "
                 "host root with fewer capabilities)")
      ->capture_default_str();
  app.add_option("--default-pids", f.default_pids,
                 "pids.max of every sandbox: a fork bomb stops there (16 to 4194304)")
      ->capture_default_str();
  app.add_option("--default-open-files", f.default_open_files,
                 "RLIMIT_NOFILE of sandbox processes (64 to 1048576; lowered to sbxd's own hard "
                 "limit with a warning when above it)")
      ->capture_default_str();
  app.add_option("--tmp-mib", f.tmp_mib,
                 "size of each sandbox's tmpfs /tmp in MiB (1 to 1048576; pages in it count "
                 "against the sandbox's memory limit)")
      ->capture_default_str();
  app.add_option("--shm-mib", f.shm_mib,
                 "size of each sandbox's tmpfs /dev/shm in MiB (1 to 1048576; also counted as "
                 "memory)")
      ->capture_default_str();
  app.add_option("--warm-pool", f.warm_pools,
                 "TEMPLATE=N: keep N sandboxes of TEMPLATE ready so that creates with the default "
                 "resources skip the launch (repeatable; N=0 turns a pool off)")
      ->capture_default_str();
  app.add_option("--seccomp-policy", f.seccomp_policy,
                 "seccomp policy JSON for sandboxes (format: src/runtime/ns/seccomp_policy.json; "
                 "default: that file, embedded at build time)");
  app.add_flag("--check", f.check,
               "check this host for the selected runtime (the checks of `sbx doctor`), print the "
               "result and exit: 0 when no required check fails, 1 otherwise");
  app.add_flag("--json", f.check_json, "with --check: print the checks as JSON");
  CLI11_PARSE(app, argc, argv);

  // A client that disconnects mid-write must cost an error code, not the daemon.
  signal(SIGPIPE, SIG_IGN);
  // Block the stop signals before any thread starts so that only sigwait below sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  spdlog::set_level(spdlog::level::from_str(f.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %^%l%$ %v", spdlog::pattern_time_type::utc);
  if (f.agent_path.empty()) f.agent_path = DefaultAgentPath();
  if (f.runtime != "ns" && f.runtime != "fake") {
    return Fail(absl::InvalidArgumentError(
        fmt::format("--runtime '{}': expected ns or fake", f.runtime)));
  }
  const sbx::daemon::PreflightConfig preflight{f.state_dir, f.runtime, f.agent_path, f.userns,
                                               f.seccomp_policy};
  if (f.check) return sbx::daemon::RunCheckCommand(preflight, f.check_json);

  // A policy that does not compile stops sbxd before anything touches the host.
  if (!f.seccomp_policy.empty()) {
    if (auto p = sbx::runtime::ns::BuildSeccompProgramFromFile(f.seccomp_policy); !p.ok()) {
      return Fail(sbx::Annotate(p.status(), "--seccomp-policy"));
    }
  }
  auto listen = SplitListen(f.listen);
  if (!listen.ok()) return Fail(listen.status());
  for (const absl::Status& st :
       {CheckFlagRange("--default-pids", f.default_pids, 16, 4194304,
                       "the agent and a shell need a few; the kernel's pid_max caps the rest"),
        CheckFlagRange("--default-open-files", f.default_open_files, 64, 1048576,
                       "below 64 ordinary programs fail; 1048576 is the kernel's default nr_open"),
        CheckFlagRange("--tmp-mib", f.tmp_mib, 1, 1048576, "a tmpfs size in MiB"),
        CheckFlagRange("--shm-mib", f.shm_mib, 1, 1048576, "a tmpfs size in MiB")}) {
    if (!st.ok()) return Fail(st);
  }
  sbx::runtime::Resources defaults;
  defaults.pids = f.default_pids;
  defaults.open_files = ClampOpenFiles(f.default_open_files);
  defaults.tmp_mib = f.tmp_mib;
  defaults.shm_mib = f.shm_mib;
  if (auto st = sbx::daemon::EnsureStateDir(f.state_dir); !st.ok()) return Fail(st);
  if (f.admin_token.empty()) {
    if (const char* env = std::getenv("SBX_ADMIN_TOKEN"); env && *env) f.admin_token = env;
  }
  auto admin = sbx::daemon::LoadOrCreateSecret(fs::path(f.state_dir) / "admin-token",
                                               f.admin_token);
  if (!admin.ok()) return Fail(admin.status());
  auto attach_key = sbx::daemon::LoadOrCreateSecret(fs::path(f.state_dir) / "attach-key", "");
  if (!attach_key.ok()) return Fail(attach_key.status());

  auto store = sbx::store::OpenSqliteStore((fs::path(f.state_dir) / "sbx.db").string());
  if (!store.ok()) return Fail(store.status());
  auto templates = sbx::service::TemplateRegistry::Create(f.state_dir);
  if (!templates.ok()) return Fail(templates.status());
  // Checked before the runtime touches the host.
  std::vector<sbx::service::WarmPoolConfig> warm_pools;
  for (const auto& spec : f.warm_pools) {
    auto pool = ParseWarmPool(spec, f.runtime);
    if (!pool.ok()) return Fail(pool.status());
    if (pool->size > 0) {
      // A pool of a template that does not exist would only log failed builds forever.
      if (auto t = templates->Resolve(pool->template_name); !t.ok()) {
        return Fail(absl::InvalidArgumentError(
            fmt::format("--warm-pool '{}': {}", spec, std::string(t.status().message()))));
      }
    }
    warm_pools.push_back(*pool);
  }

  // A host that lacks what the runtime needs is refused here, with the doctor's diagnosis,
  // instead of at the first create.
  if (auto st = sbx::daemon::StartupPreflight(preflight, *templates); !st.ok()) return Fail(st);

  std::map<std::string, sbx::runtime::Backend*> backends;
  std::unique_ptr<sbx::runtime::Backend> ns_backend, fake_backend;
  if (f.runtime == "ns") {
    sbx::runtime::ns::NsOptions nopts;
    nopts.state_dir = f.state_dir;
    nopts.agent_path = f.agent_path;
    nopts.agent_buffer_bytes = f.buffer_bytes;
    nopts.cgroup_favor_dynmods = f.cgroup_favor_dynmods;
    nopts.netns_pool_size = f.netns_pool;
    nopts.disk_pool_size = f.disk_pool;
    nopts.user_namespaces = f.userns;
    nopts.userns_pool_size = f.userns_pool;
    nopts.seccomp_policy_path = f.seccomp_policy;
    ns_backend = std::make_unique<sbx::runtime::ns::NsBackend>(nopts);
    if (auto st = ns_backend->Probe(); !st.ok()) {
      return Fail(sbx::Annotate(st, "runtime ns cannot work on this host"));
    }
    backends["ns"] = ns_backend.get();
  } else {
    fake_backend =
        std::make_unique<sbx::runtime::FakeBackend>(f.state_dir, f.agent_path, f.buffer_bytes);
    if (auto st = fake_backend->Probe(); !st.ok()) return Fail(sbx::Annotate(st, "runtime fake"));
    backends["fake"] = fake_backend.get();
  }

  sbx::ops::OperationEngine engine(f.workers);
  sbx::service::ServiceOptions sopts;
  sopts.default_runtime = f.runtime;
  sopts.attach_key = *attach_key;
  sopts.warm_pools = std::move(warm_pools);
  sopts.defaults = defaults;
  sopts.output_buffer_bytes = static_cast<int64_t>(f.buffer_bytes);
  sbx::service::SandboxService svc(sopts, **store, engine, std::move(*templates), backends);

  sbx::api::ApiOptions aopts;
  aopts.admin_token = *admin;
  sbx::api::Api api(svc, aopts);
  sbx::http::ServerOptions hopts;
  hopts.host = listen->first;
  hopts.port = listen->second;
  hopts.threads = f.http_threads;
  sbx::http::Server server(
      hopts, [&api](sbx::http::RequestContext& ctx) { return api.Handle(ctx); },
      sbx::api::RawErrorResponse);
  if (auto st = server.Listen(); !st.ok()) return Fail(st);
  server.Start();
  // /healthz answers from here on; /readyz once the reconcile below is done.
  if (auto st = svc.Reconcile(); !st.ok()) {
    server.Stop();
    return Fail(sbx::Annotate(st, "start-up reconcile"));
  }

  svc.StartWarmPools();

  std::string host = hopts.host.find(':') != std::string::npos ? "[" + hopts.host + "]" : hopts.host;
  std::cout << "sbxd listening on http://" << host << ":" << server.port() << std::endl;
  spdlog::info("sbxd ready: runtime {}, state dir {}, admin token in {}", f.runtime, f.state_dir,
               f.admin_token.empty() ? (fs::path(f.state_dir) / "admin-token").string()
                                     : std::string("--admin-token/SBX_ADMIN_TOKEN"));

  for (;;) {
    int sig = 0;
    sigwait(&stop, &sig);
    if (sig == SIGHUP) {
      spdlog::info("SIGHUP: nothing to reload yet");
      continue;
    }
    spdlog::info("signal {}: stopping the API; sandboxes keep running", sig);
    break;
  }
  server.Stop();
  engine.Shutdown();
  return 0;
}
