// sbxd: loads its configuration (daemon/config.h), wires the store, the runtimes, the operation
// engine, the service and the HTTP API, then waits for SIGTERM/SIGINT, and reloads the
// configuration on SIGHUP. Sandboxes outlive this process: stopping sbxd stops the API only,
// and the next start re-adopts what is still running.
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "api/api.h"
#include "api/routes.h"
#include "api/status_to_http.h"
#include "common/files.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/process.h"
#include "common/status_util.h"
#include "daemon/cluster_role.h"
#include "daemon/config.h"
#include "daemon/density.h"
#include "daemon/egress_config.h"
#include "daemon/host_capacity.h"
#include "common/ticker.h"
#include "daemon/preflight.h"
#include "daemon/runtime_options.h"
#include "daemon/state_files.h"
#include "daemon/templates_config.h"
#include "http/server.h"
#include "http/tls.h"
#include "net/dns_server.h"
#include "net/conn_proxy.h"
#include "net/conn_proxy_host.h"
#include "net/sandbox_net.h"
#include "ops/operation_engine.h"
#include "runtime/doctor/density.h"
#include "runtime/fake/fake_backend.h"
#include "runtime/microvm/microvm_backend.h"
#include "runtime/ns/ns_backend.h"
#include "runtime/ns/userns.h"
#include "runtime/ns/seccomp.h"
#include "service/sandbox_service.h"
#include "service/tenancy.h"
#include "service/template_ref.h"
#include "service/templates.h"
#include "store/open_store.h"

namespace {

namespace fs = std::filesystem;
using sbx::daemon::Config;

// A sandbox cannot get more open files than sbxd's own hard RLIMIT_NOFILE: raising a hard limit
// needs CAP_SYS_RESOURCE, which root lacks on some hosts (20000 on the project's machines).
// Clamped with a warning rather than refused, so the default works on such hosts.
int64_t ClampOpenFiles(int64_t wanted, const std::string& label) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    spdlog::warn("{}: getrlimit(RLIMIT_NOFILE): {}; keeping {}", label,
                 sbx::ErrnoMessage(errno), wanted);
    return wanted;
  }
  if (rl.rlim_max != RLIM_INFINITY && static_cast<rlim_t>(wanted) > rl.rlim_max) {
    spdlog::warn("{} exceeds sbxd's hard RLIMIT_NOFILE {}, which cannot be raised here; "
                 "sandboxes get {}",
                 label, static_cast<uint64_t>(rl.rlim_max), static_cast<uint64_t>(rl.rlim_max));
    return static_cast<int64_t>(rl.rlim_max);
  }
  return wanted;
}

std::string DefaultAgentPath() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "sbx-agent";
  return (self.parent_path() / "sbx-agent").string();
}

std::vector<std::string> Environment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

// Set once the log goes to a file (log.file): a start-up failure is then recorded there too.
// On stderr the plain line alone says it; a log record beside it printed every error twice.
bool g_log_to_file = false;

int Fail(const absl::Status& s) {
  if (g_log_to_file) spdlog::critical("sbxd: {}", std::string(s.message()));
  std::fprintf(stderr, "sbxd: %s\n", std::string(s.message()).c_str());
  return 1;
}

// ---------------------------------------------------------------------------------------------
// The configuration applied to the layers: at start-up, and for the live keys on SIGHUP. The
// keys themselves are defined in config_keys.cc.

// The configured defaults, with open_files lowered to what this process can hand out.
sbx::runtime::Resources DefaultsOf(const Config& c) {
  sbx::runtime::Resources r = c.sandbox.defaults;
  r.open_files =
      ClampOpenFiles(r.open_files, sbx::daemon::Describe(c, "sandbox.defaults.open_files"));
  return r;
}

// Pools run on the default runtime; entries of size 0 turn a pool off. With egress on, each
// pool has a network-ready twin (egress.warm_pool) when the default runtime can build them.
std::vector<sbx::service::WarmPoolConfig> WarmPoolsOf(const Config& c) {
  std::vector<sbx::service::WarmPoolConfig> out;
  const bool networked = c.egress.enabled && c.runtime.default_runtime == "ns";
  for (const auto& [name, size] : c.warm_pool) {
    out.push_back({c.runtime.default_runtime, name, static_cast<int>(size)});
    out.push_back({c.runtime.default_runtime, name,
                   networked && size > 0 ? static_cast<int>(c.egress.warm_pool) : 0, true});
  }
  return out;
}

sbx::service::TimerSettings TimersOf(const Config& c) {
  sbx::service::TimerSettings t;
  t.default_timeout_s = c.sandbox.timers.timeout_s;
  t.default_idle_suspend_s = c.sandbox.timers.idle_suspend_s;
  t.idempotency_retention = std::chrono::seconds(c.retention.idempotency_keys_s);
  t.deleted_retention = std::chrono::seconds(c.retention.deleted_sandboxes_s);
  return t;
}

// What the host's limits hold, computed at start-up (ResolveDensity): admission.max_sandboxes
// 0 means this. The key needs a restart, so a reload keeps it.
int64_t g_host_holds = 0;

sbx::service::AdmissionSettings AdmissionOf(const Config& c) {
  sbx::service::AdmissionSettings a = c.admission;
  if (a.max_sandboxes == 0) a.max_sandboxes = g_host_holds;
  return a;
}

sbx::service::LiveOptions LiveOptionsOf(const Config& c) {
  sbx::service::LiveOptions live;
  live.defaults = DefaultsOf(c);
  live.timers = TimersOf(c);
  live.attach_token_ttl = std::chrono::seconds(c.sessions.attach_token_ttl_s);
  live.warm_pools = WarmPoolsOf(c);
  live.admission = AdmissionOf(c);
  return live;
}

void SetLogLevel(const Config& c) {
  if (auto st = sbx::log::SetLevel(c.log.level); !st.ok()) {
    spdlog::error("SIGHUP: log.level: {}", std::string(st.message()));
  }
}

// The listener's certificate and key (tls.*), or nullptr for plain HTTP. A file that does not
// load is an error naming the key, the file and OpenSSL's reason.
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> LoadTls(const Config& c) {
  if (!c.tls.enabled()) return nullptr;
  auto ctx = sbx::http::LoadServerTls(c.tls.cert_file, c.tls.key_file);
  if (!ctx.ok()) {
    return sbx::Annotate(ctx.status(),
                         fmt::format("{}, {}", sbx::daemon::Describe(c, "tls.cert_file"),
                                     sbx::daemon::Describe(c, "tls.key_file")));
  }
  return ctx;
}

// SIGHUP's part for TLS: the files are read again even when their names did not change (a
// renewed certificate is written over the old one). The scheme stays as started; a pair that
// does not load leaves the running certificate serving. `next` gets the tls.* values in force.
void ReloadTls(const Config& running, Config& next, sbx::http::Server& server) {
  if (running.tls.enabled() != next.tls.enabled()) {
    spdlog::warn("SIGHUP: tls.cert_file and tls.key_file switch between http and https, which "
                 "needs a restart; keeping {}",
                 running.tls.enabled() ? "https" : "http");
    next.tls = running.tls;
    return;
  }
  if (!next.tls.enabled()) return;
  auto ctx = LoadTls(next);
  absl::Status st = ctx.ok() ? server.SetTls(*ctx) : ctx.status();
  if (!st.ok()) {
    spdlog::error("SIGHUP: TLS certificate not reloaded, the running one stays: {}",
                  std::string(st.message()));
    next.tls = running.tls;
    return;
  }
  spdlog::info("SIGHUP: TLS certificate reloaded from {} ({}); new connections get it",
               next.tls.cert_file, sbx::http::DescribeServerTls(**ctx));
}

sbx::service::TenancyOptions TenancyOptionsOf(const Config& c) {
  sbx::service::TenancyOptions o;
  o.default_rate_per_s = static_cast<double>(c.tenancy.rate_limit_rps);
  o.default_burst = static_cast<uint64_t>(
      c.tenancy.rate_limit_burst > 0 ? c.tenancy.rate_limit_burst
                                     : std::max<int64_t>(1, c.tenancy.rate_limit_rps));
  o.max_token_ttl_s = c.tenancy.max_token_ttl_s;
  return o;
}

// SIGHUP: re-reads the file and the environment over the same flags and applies what can change
// while sbxd runs. Any error leaves the running configuration as it was.
void Reload(const sbx::daemon::CommandLine& cl, Config& running, sbx::api::Api& api,
            sbx::service::SandboxService& svc, sbx::service::Tenancy& tenancy,
            sbx::http::Server& server) {
  auto loaded = sbx::daemon::Load(cl, Environment());
  if (!loaded.ok()) {
    spdlog::error("SIGHUP: configuration not reloaded, the running one stays: {}",
                  std::string(loaded.status().message()));
    return;
  }
  for (const auto& w : loaded->warnings) spdlog::warn("SIGHUP: {}", w);
  sbx::daemon::ReloadPlan plan = sbx::daemon::PlanReload(running, loaded->config);
  if (auto st = svc.Reconfigure(LiveOptionsOf(plan.config)); !st.ok()) {
    spdlog::error("SIGHUP: configuration not reloaded, the running one stays: {}",
                  std::string(st.message()));
    return;
  }
  api.SetLimits(plan.config.sandbox.limits);
  tenancy.SetOptions(TenancyOptionsOf(plan.config));
  SetLogLevel(plan.config);
  ReloadTls(running, plan.config, server);
  for (const auto& ch : plan.needs_restart) {
    spdlog::warn("SIGHUP: {} changed ({} -> {}) but needs a restart; keeping {}", ch.key,
                 ch.from, ch.to, ch.from);
  }
  std::vector<std::string> applied;
  for (const auto& ch : plan.applied) {
    // A change a step above kept from applying (tls.*) has been logged there.
    if (sbx::daemon::ShowValue(plan.config, ch.key) != ch.to) continue;
    applied.push_back(fmt::format("{} {} -> {}", ch.key, ch.from, ch.to));
  }
  running = std::move(plan.config);
  spdlog::info("SIGHUP: configuration reloaded ({}): {}",
               loaded->file.empty() ? std::string("no file") : loaded->file,
               applied.empty() ? std::string("nothing to change")
                               : fmt::format("{}", fmt::join(applied, ", ")));
}

// ---------------------------------------------------------------------------------------------
// Start-up, one step per function, in the order main() runs them. Each returns the status that
// stops sbxd; the parts they make live in Daemon, which tears them down in reverse order.

struct Daemon {
  Config cfg;  // the running configuration: a SIGHUP replaces its live keys
  std::string agent_path;
  std::string admin_token;
  std::vector<sbx::service::AttachTokens::Key> attach_keys;  // STATE_DIR/attach-keys.json
  sbx::store::StorePtr store;
  std::optional<sbx::service::TemplateRegistry> templates;  // until the service takes it
  // Networked sandboxes' host side (egress.enabled only); outlives the backends that use it.
  std::unique_ptr<sbx::net::NetworkHost> network;
  // Its resolver, on a thread of its own; declared after `network`, so it stops first.
  std::unique_ptr<sbx::net::DnsServer> dns;
  // Domain rules' Host/SNI check on each connection (net/conn_proxy.h); stops before network.
  std::unique_ptr<sbx::net::ConnProxy> proxy;
  std::shared_ptr<const sbx::net::ProfileCatalog> egress_catalog;
  std::unique_ptr<sbx::runtime::Backend> ns_backend, fake_backend, microvm_backend;
  std::map<std::string, sbx::runtime::Backend*> backends;
  // Runtimes this sbxd offers but this host cannot run, with the reason (a create asking for
  // one gets 501 naming it).
  std::map<std::string, std::string> unavailable_runtimes;
  // Declared before the engine, which runs its jobs: destroyed after the engine's shutdown.
  std::unique_ptr<sbx::service::TemplateService> template_svc;
  std::unique_ptr<sbx::ops::OperationEngine> engine;
  std::unique_ptr<sbx::service::SandboxService> svc;
  std::unique_ptr<sbx::service::Tenancy> tenancy;
  std::unique_ptr<sbx::service::Cluster> cluster;
  std::unique_ptr<sbx::api::Api> api;
  std::unique_ptr<sbx::http::Server> server;
  // Last: its heartbeat reads the service, so it stops first.
  sbx::daemon::NodeRole node;
};

// Blocks the stop signals before any thread starts so that only sigwait (WaitForSignals) sees
// them; a client that disconnects mid-write must cost an error code, not the daemon.
sigset_t BlockSignals() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

absl::Status InitLog(const Config& cfg, const std::vector<std::string>& warnings) {
  sbx::log::Options log_opts;
  log_opts.level = cfg.log.level;
  log_opts.format = cfg.log.format;
  log_opts.file = cfg.log.file;
  SBX_RETURN_IF_ERROR(sbx::log::Init(log_opts));
  g_log_to_file = !log_opts.file.empty();
  for (const auto& w : warnings) spdlog::warn("{}", w);
  return absl::OkStatus();
}

// What can be refused before anything touches the host: a seccomp policy that does not
// compile, the listen address, connection caps that do not fit in RLIMIT_NOFILE, a TLS
// certificate or key that does not load. Returns the HTTP server's options but for the API's
// callbacks.
absl::StatusOr<sbx::http::ServerOptions> CheckSettings(const Config& cfg) {
  if (!cfg.runtime.ns.seccomp_policy.empty()) {
    if (auto p = sbx::runtime::ns::BuildSeccompProgramFromFile(cfg.runtime.ns.seccomp_policy);
        !p.ok()) {
      return sbx::Annotate(p.status(), sbx::daemon::Describe(cfg, "runtime.ns.seccomp_policy"));
    }
  }
  SBX_ASSIGN_OR_RETURN(auto listen, sbx::daemon::SplitListen(cfg.server.listen));
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) {
    return sbx::ErrnoStatus(errno, "connection caps: getrlimit(RLIMIT_NOFILE)");
  }
  SBX_ASSIGN_OR_RETURN(
      sbx::daemon::ConnectionLimits conn,
      sbx::daemon::ResolveConnectionLimits(
          cfg, nofile.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 20 : nofile.rlim_cur));
  sbx::http::ServerOptions hopts;
  hopts.host = listen.first;
  hopts.port = listen.second;
  hopts.threads = static_cast<int>(cfg.server.http_threads);
  hopts.max_connections = conn.max_connections;
  hopts.max_connections_per_ip = conn.max_connections_per_ip;
  hopts.reserved_connections = conn.reserved_connections;
  hopts.header_timeout = std::chrono::seconds(cfg.server.header_timeout_s);
  hopts.idle_timeout = std::chrono::seconds(cfg.server.idle_timeout_s);
  SBX_ASSIGN_OR_RETURN(hopts.tls, LoadTls(cfg));
  return hopts;
}

// The state dir, its secrets, the database and the templates.
absl::Status OpenState(Daemon& d) {
  const std::string& state_dir = d.cfg.state.dir;
  SBX_RETURN_IF_ERROR(sbx::daemon::EnsureStateDir(state_dir));
  SBX_ASSIGN_OR_RETURN(d.admin_token, sbx::daemon::LoadOrCreateSecret(
                                          fs::path(state_dir) / "admin-token",
                                          d.cfg.server.admin_token));
  SBX_ASSIGN_OR_RETURN(d.attach_keys, sbx::service::AttachTokens::LoadOrCreateRing(
                                          state_dir, std::chrono::system_clock::now()));
  const sbx::store::StoreConfig store_cfg{d.cfg.store.url,
                                          static_cast<int>(d.cfg.store.pool_size)};
  SBX_ASSIGN_OR_RETURN(d.store, sbx::store::OpenStore(store_cfg, state_dir));
  spdlog::info("store: {}", sbx::store::DescribeStore(store_cfg, state_dir));
  SBX_ASSIGN_OR_RETURN(auto templates, sbx::service::TemplateRegistry::Create(state_dir));
  d.templates.emplace(std::move(templates));
  // Checked before the runtime touches the host: a pool of a template that does not exist
  // would only log failed builds forever. Image templates are not loaded yet: their tags and
  // releases are looked up in the store (whether a release is usable is checked once loaded).
  for (const auto& pool : WarmPoolsOf(d.cfg)) {
    if (pool.size == 0) continue;
    auto t = d.templates->Resolve(pool.template_name);
    if (t.ok()) continue;
    bool stored = false;
    if (auto ref = sbx::service::ParseTemplateRef(pool.template_name); ref.ok()) {
      (void)d.store->Transact([&](sbx::store::Tx& tx) -> absl::Status {
        stored = ref->digest.empty() ? tx.GetTag(ref->name, ref->tag).ok()
                                     : tx.GetImage(ref->digest).ok();
        return absl::OkStatus();
      });
    }
    if (!stored) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {}", sbx::daemon::Describe(d.cfg, "warm_pool." + pool.template_name),
                      std::string(t.status().message())));
    }
  }
  return absl::OkStatus();
}

// sbxd's DNS resolver for the networked sandboxes (net/dns_server.h), toward egress.dns_upstream
// or the host's own nameservers.
absl::Status StartResolver(Daemon& d, const sbx::daemon::EgressSetup& setup) {
  sbx::net::DnsServerOptions opts;
  opts.port = setup.policy.dns_port;
  opts.upstreams = setup.dns_upstreams;
  if (opts.upstreams.empty()) {
    opts.upstreams = sbx::net::UpstreamsOfResolvConf(sbx::ReadFileOrEmpty("/etc/resolv.conf"));
    if (opts.upstreams.empty()) {
      spdlog::warn("dns: no egress.dns_upstream and no nameserver in /etc/resolv.conf: the "
                   "sandboxes' lookups will fail (SERVFAIL)");
    }
  }
  auto dns = sbx::net::DnsServer::Start(d.network.get(), opts);
  if (!dns.ok()) {
    return sbx::Annotate(dns.status(), sbx::daemon::Describe(d.cfg, "egress.dns_port"));
  }
  d.dns = std::move(*dns);
  std::string ups;
  for (const auto& u : opts.upstreams) ups += (ups.empty() ? "" : ", ") + u.ToString();
  spdlog::info("dns: resolver on port {} (udp, tcp), upstream {}", opts.port,
               ups.empty() ? "none" : ups);
  return absl::OkStatus();
}

// Networking, only with egress.enabled: forwarding on and sbx's nftables table (re)made. Its
// start-up sweep runs with the runtime's (NsBackend::Sweep), when the service knows which
// sandboxes exist. Off: nothing of the host's network is touched, as before networking.
absl::Status StartNetwork(Daemon& d) {
  const Config& cfg = d.cfg;
  if (!cfg.egress.enabled) return absl::OkStatus();
  if (cfg.runtime.default_runtime == "fake") {
    return absl::InvalidArgumentError(fmt::format(
        "{}: networked sandboxes need runtime.default = \"ns\" or \"microvm\"",
        sbx::daemon::Describe(cfg, "egress.enabled")));
  }
  SBX_ASSIGN_OR_RETURN(sbx::daemon::EgressSetup setup, sbx::daemon::EgressFromConfig(cfg));
  auto host = sbx::net::NetworkHost::Start(setup.policy);
  if (!host.ok()) {
    return sbx::Annotate(host.status(),
                         "egress.enabled: start networking (needs root, veth and nf_tables; "
                         "`sbx doctor` checks them)");
  }
  d.network = std::move(*host);
  SBX_RETURN_IF_ERROR(StartResolver(d, setup));
  sbx::net::ProxyOptions popts;
  popts.port = static_cast<uint16_t>(cfg.egress.proxy_port);
  popts.idle_timeout = std::chrono::seconds(cfg.egress.proxy_idle_timeout_s);
  auto proxy = sbx::net::ConnProxy::Start(popts, sbx::net::ProxyHooksFor(d.network.get()));
  if (!proxy.ok()) {
    return sbx::Annotate(proxy.status(), sbx::daemon::Describe(cfg, "egress.proxy_port"));
  }
  d.proxy = std::move(*proxy);
  // A PATCH resets the proxied connections its new rules no longer allow (the conntrack cut
  // cannot reach them: the proxy's own connection leaves from the host). Set before serving;
  // the proxy is stopped only after the API.
  d.network->SetCutHook([proxy = d.proxy.get()](const std::string& id,
                                                const sbx::net::EffectiveRules& rules) {
    size_t n = proxy->CutDisallowed(id, rules);
    if (n > 0) spdlog::info("sandbox {}: egress PATCH reset {} proxied connections", id, n);
  });
  // Recent denials are a help to users, not a safeguard: without them sbxd still enforces.
  if (auto st = d.network->StartDenialReader(); !st.ok()) {
    spdlog::warn("egress: recent denials unavailable (GET /v1/sandboxes/{{id}}/egress shows "
                 "none): {}",
                 std::string(st.message()));
  }
  d.egress_catalog = std::make_shared<const sbx::net::ProfileCatalog>(std::move(setup.catalog));
  spdlog::info("networking on: address pool {} and {} ({} sandboxes), uplink {}",
               setup.policy.pool4.ToString(), setup.policy.pool6.ToString(),
               d.network->pool().capacity(), cfg.egress.uplink.empty() ? "any" : cfg.egress.uplink);
  return absl::OkStatus();
}

// The microvm runtime beside the default one (runtime.microvm.enabled): a host that cannot run
// it keeps sbxd starting, and the reason goes to the log and to every create that asks for it.
void StartMicrovm(Daemon& d) {
  const Config& cfg = d.cfg;
  if (!cfg.runtime.microvm.enabled) {
    d.unavailable_runtimes["microvm"] = "runtime.microvm.enabled is false";
    return;
  }
  auto opts = sbx::daemon::MicrovmOptionsOf(cfg, d.agent_path);
  opts.network = d.network.get();
  auto backend = std::make_unique<sbx::runtime::microvm::MicrovmBackend>(std::move(opts));
  if (absl::Status st = backend->Probe(); !st.ok()) {
    spdlog::warn("runtime microvm unavailable: {}", std::string(st.message()));
    d.unavailable_runtimes["microvm"] = std::string(st.message());
    return;
  }
  spdlog::info("runtime microvm: accel {} ({})", backend->accel(), backend->accel_reason());
  d.backends["microvm"] = backend.get();
  d.microvm_backend = std::move(backend);
}

// The ns runtime: the default one, or offered beside a microvm default (runtime.ns.enabled),
// where a host that cannot run it only withholds it.
absl::Status StartNs(Daemon& d, bool is_default) {
  const Config& cfg = d.cfg;
  if (!is_default && !cfg.runtime.ns.enabled) {
    d.unavailable_runtimes["ns"] = "runtime.ns.enabled is false";
    return absl::OkStatus();
  }
  auto ns_opts = sbx::daemon::NsOptionsOf(cfg, d.agent_path);
  ns_opts.network = d.network.get();
  auto backend = std::make_unique<sbx::runtime::ns::NsBackend>(std::move(ns_opts));
  if (absl::Status st = backend->Probe(); !st.ok()) {
    if (is_default) return sbx::Annotate(st, "runtime ns cannot work on this host");
    spdlog::warn("runtime ns unavailable: {}", std::string(st.message()));
    d.unavailable_runtimes["ns"] = std::string(st.message());
    return absl::OkStatus();
  }
  d.ns_backend = std::move(backend);
  d.backends["ns"] = d.ns_backend.get();
  return absl::OkStatus();
}

// The default runtime, probed: a host it cannot work on stops sbxd here.
absl::Status StartRuntime(Daemon& d) {
  const Config& cfg = d.cfg;
  if (cfg.runtime.default_runtime == "ns") {
    StartMicrovm(d);
    return StartNs(d, /*is_default=*/true);
  }
  if (cfg.runtime.default_runtime == "microvm") {
    if (!cfg.runtime.microvm.enabled) {
      return absl::InvalidArgumentError(
          fmt::format("{} contradicts {}", sbx::daemon::Describe(cfg, "runtime.default"),
                      sbx::daemon::Describe(cfg, "runtime.microvm.enabled")));
    }
    StartMicrovm(d);
    if (!d.microvm_backend) {
      return absl::FailedPreconditionError(fmt::format(
          "runtime microvm cannot work on this host: {}", d.unavailable_runtimes["microvm"]));
    }
    return StartNs(d, /*is_default=*/false);
  }
  d.fake_backend = std::make_unique<sbx::runtime::FakeBackend>(
      cfg.state.dir, d.agent_path, static_cast<size_t>(cfg.sessions.output_buffer_bytes));
  SBX_RETURN_IF_ERROR(sbx::Annotate(d.fake_backend->Probe(), "runtime fake"));
  d.backends["fake"] = d.fake_backend.get();
  return absl::OkStatus();
}

// [templates] of the configuration (docs/config.md), credentials read from their file.
absl::StatusOr<sbx::service::TemplateServiceOptions> TemplateOptionsOf(const Config& cfg) {
  sbx::service::TemplateServiceOptions o;
  o.dir = (fs::path(cfg.state.dir) / "templates").string();
  const auto& t = cfg.templates;
  o.limits.max_image_bytes = static_cast<uint64_t>(t.max_image_mib) << 20;
  o.limits.max_store_bytes = static_cast<uint64_t>(t.max_store_mib) << 20;
  o.limits.max_archive_bytes = static_cast<uint64_t>(t.max_archive_mib) << 20;
  o.limits.max_entries_per_layer = static_cast<uint64_t>(t.max_entries_per_layer);
  o.registry.proxy = t.registry_proxy;
  o.registry.no_proxy = t.registry_no_proxy;
  o.registry.parallel_layers = static_cast<int>(t.registry_parallel_layers);
  SBX_ASSIGN_OR_RETURN(o.registry.registries, sbx::daemon::RegistryCredentials(cfg));
  return o;
}

// The operation engine and the service over the store, the templates and the runtime.
absl::Status StartService(Daemon& d, const sbx::runtime::Resources& defaults) {
  const Config& cfg = d.cfg;
  // Checked first: a credentials file that does not parse stops sbxd before anything starts.
  SBX_ASSIGN_OR_RETURN(sbx::service::TemplateServiceOptions topts, TemplateOptionsOf(cfg));
  d.engine = std::make_unique<sbx::ops::OperationEngine>(static_cast<int>(cfg.runtime.workers));
  sbx::service::ServiceOptions sopts;
  sopts.default_runtime = cfg.runtime.default_runtime;
  sopts.node_name = sbx::daemon::NodeNameOf(cfg);
  sopts.claim_unassigned = cfg.node.role == "all";
  topts.node_name = sopts.node_name;
  // Nodes share the catalogue in the store and give each other the layers (docs/scale.md,
  // "Templates"), with the admin token every node of a cluster is given.
  topts.cluster = cfg.node.role == "node";
  topts.limits.keep_blobs = topts.cluster;
  topts.peer_token = d.admin_token;
  topts.layer_url = sbx::api::LayerBlobUrl;
  topts.gc_url = sbx::api::NodeGcUrl;
  if (topts.cluster) {
    sopts.sync_template = [&d](const std::string& ref, const std::string& ns) {
      return d.template_svc ? d.template_svc->SyncFromCluster(ref, ns) : absl::OkStatus();
    };
  }
  sopts.unavailable_runtimes = d.unavailable_runtimes;
  sopts.attach_keys = d.attach_keys;
  sopts.attach_keys_file =
      (fs::path(cfg.state.dir) / sbx::service::AttachTokens::kRingFile).string();
  sopts.attach_token_ttl = std::chrono::seconds(cfg.sessions.attach_token_ttl_s);
  sopts.warm_pools = WarmPoolsOf(cfg);
  sopts.defaults = defaults;
  sopts.output_buffer_bytes = cfg.sessions.output_buffer_bytes;
  sopts.timers = TimersOf(cfg);
  sopts.admission = AdmissionOf(cfg);
  sopts.guest_replies.in_flight = static_cast<size_t>(cfg.server.guest_replies_in_flight);
  sopts.guest_replies.per_sandbox = static_cast<size_t>(cfg.server.guest_replies_per_sandbox);
  if (d.network) {
    sopts.egress_catalog = d.egress_catalog;
    // The nft counters (packets) plus what sbxd itself refused (resolver, proxy: DenialLog).
    sopts.egress_denials = [host = d.network.get()](const std::string& id)
        -> absl::StatusOr<std::map<std::string, uint64_t>> {
      auto counts = host->Denials(id);
      if (!counts.ok()) return counts;
      for (const auto& [reason, n] : host->denials_log().Counts(id)) (*counts)[reason] += n;
      return counts;
    };
    sopts.egress_recent_denials = [host = d.network.get()](const std::string& id) {
      return host->denials_log().Recent(id);
    };
    sopts.egress_patch = [host = d.network.get()](const std::string& id, const std::string& profile,
                                                  const std::vector<sbx::net::EgressRule>& allow) {
      return host->PatchAllow(id, profile, allow);
    };
  }
  std::vector<const sbx::runtime::Backend*> capacity_backends;
  for (const auto& [name, backend] : d.backends) capacity_backends.push_back(backend);
  sopts.host_capacity = [state_dir = cfg.state.dir, capacity_backends] {
    return sbx::daemon::ProbeHostCapacity(state_dir, capacity_backends);
  };
  // A copy shares the registry's images: what the template service records, creates resolve.
  sbx::service::TemplateRegistry shared = *d.templates;
  d.svc = std::make_unique<sbx::service::SandboxService>(sopts, *d.store, *d.engine,
                                                         std::move(*d.templates), d.backends);
  d.templates.reset();
  // Build steps run in sandboxes of the sandbox service (it outlives every build: the engine
  // is shut down before it goes).
  topts.build_step = [svc = d.svc.get()](const sbx::service::BuildStepRequest& r) {
    return svc->RunBuildStep(r);
  };
  topts.pooled_digests = [svc = d.svc.get()] { return svc->PooledDigests(); };
  topts.template_changed = [svc = d.svc.get()] { svc->TemplateChanged(); };
  auto tpl = sbx::service::TemplateService::Open(std::move(topts), *d.store, *d.engine,
                                                 std::move(shared));
  if (tpl.ok()) {
    d.template_svc = std::move(*tpl);
  } else {
    // `base` still works; the template routes answer 501 naming the log.
    spdlog::error("templates: the template store did not open, only `base` is served: {}",
                  std::string(tpl.status().message()));
  }
  // Once image templates are loaded, before any pool fills: a pool of a template that does not
  // exist would only log failed builds forever.
  for (const auto& pool : WarmPoolsOf(d.cfg)) {
    if (pool.size == 0) continue;
    if (auto t = d.svc->ResolveTemplate(pool.template_name); !t.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {}", sbx::daemon::Describe(d.cfg, "warm_pool." + pool.template_name),
                      std::string(t.status().message())));
    }
  }
  return absl::OkStatus();
}

// The API on the HTTP server, listening; /healthz answers from here on, /readyz once the
// service has reconciled what the store and the runtime hold.
absl::Status ServeApi(Daemon& d, sbx::http::ServerOptions hopts) {
  sbx::api::ApiOptions aopts;
  aopts.admin_token = d.admin_token;
  aopts.limits = d.cfg.sandbox.limits;
  aopts.metrics_public = d.cfg.metrics.public_endpoint;
  aopts.ports_domain = d.cfg.ports.domain;
  aopts.e2b_domain = d.cfg.e2b.domain.empty() ? d.cfg.ports.domain : d.cfg.e2b.domain;
  aopts.port_connect_timeout = std::chrono::milliseconds(d.cfg.ports.connect_timeout_ms);
  aopts.port_idle_timeout = std::chrono::seconds(d.cfg.ports.idle_timeout_s);
  aopts.templates = d.template_svc.get();
  d.tenancy = std::make_unique<sbx::service::Tenancy>(*d.store, TenancyOptionsOf(d.cfg));
  aopts.tenancy = d.tenancy.get();
  d.cluster = sbx::daemon::MakeCluster(d.cfg, *d.store);
  aopts.cluster = d.cluster.get();
  d.api = std::make_unique<sbx::api::Api>(*d.svc, aopts);
  sbx::api::Api& api = *d.api;
  hopts.privileged = [&api](const sbx::http::Request& req) { return api.Privileged(req); };
  // File uploads stream to the agent; the sandbox's disk cap bounds them (files_api.cc).
  // Uploads, and the bodies of requests to sandbox ports, stream instead of being held whole.
  hopts.stream_body = [&api](const sbx::http::Request& req) {
    return sbx::api::Api::StreamsBody(req) || api.IsPortRequest(req);
  };
  d.server = std::make_unique<sbx::http::Server>(
      hopts, [&api](sbx::http::RequestContext& ctx) { return api.Handle(ctx); },
      sbx::api::RawErrorResponse);
  SBX_RETURN_IF_ERROR(d.server->Listen());
  d.server->Start();
  if (auto st = d.svc->Reconcile(); !st.ok()) {
    d.server->Stop();
    return sbx::Annotate(st, "start-up reconcile");
  }
  return absl::OkStatus();
}

void LogReady(const Daemon& d, const sbx::http::ServerOptions& hopts,
              const std::string& config_file) {
  const Config& cfg = d.cfg;
  spdlog::info("HTTP connections: at most {} ({} per address), {} reserved for /healthz and "
               "the admin token; headers due within {} s",
               hopts.max_connections, hopts.max_connections_per_ip, hopts.reserved_connections,
               cfg.server.header_timeout_s);
  std::string host = hopts.host.find(':') != std::string::npos ? "[" + hopts.host + "]" : hopts.host;
  if (d.server->tls()) {
    spdlog::info("TLS: certificate {} ({}), key {}", cfg.tls.cert_file,
                 sbx::http::DescribeServerTls(*hopts.tls), cfg.tls.key_file);
  }
  std::cout << "sbxd listening on " << (d.server->tls() ? "https://" : "http://") << host << ":"
            << d.server->port() << std::endl;
  auto token_origin = cfg.origins.find("server.admin_token");
  spdlog::info("sbxd ready: runtime {}, state dir {}, configuration file {}, admin token from {}",
               cfg.runtime.default_runtime, cfg.state.dir,
               config_file.empty() ? std::string("none") : config_file,
               cfg.server.admin_token.empty() || token_origin == cfg.origins.end()
                   ? (fs::path(cfg.state.dir) / "admin-token").string()
                   : token_origin->second.where);
}

// Until SIGTERM or SIGINT; a SIGHUP reopens the log and reloads the configuration.
void WaitForSignals(const sigset_t& stop, const sbx::daemon::CommandLine& cl, Daemon& d) {
  for (;;) {
    int sig = 0;
    sigwait(&stop, &sig);
    if (sig == SIGHUP) {
      sbx::log::Reopen();
      Reload(cl, d.cfg, *d.api, *d.svc, *d.tenancy, *d.server);
      continue;
    }
    spdlog::info("signal {}: stopping the API; sandboxes keep running", sig);
    return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto inherited = sbx::CloseInheritedDescriptors();  // before sbxd opens any of its own
  // Large buffers (guest-sized agent replies, file chunks) come from mmap and go back to the
  // system when freed. glibc's threshold otherwise rises to the size of the first large block
  // freed, and a 4 MiB reply is then carved from the heap, never given back: sbxd's RSS would
  // stay at its peak after a burst (issue 13, finding 6). A fixed threshold stops that.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  sbx::daemon::CommandLine cl;
  CLI::App app{"sbxd: runs untrusted code in isolated sandboxes behind an HTTP API. Settings come "
               "from the built-in defaults, the configuration file, SBX_* variables and these "
               "flags, each over the one before (docs/config.md)"};
  sbx::daemon::AddFlags(app, cl);
  bool check = false, check_json = false;
  app.add_flag("--check", check,
               "check this host for the selected runtime (the checks of `sbx doctor`), print the "
               "result and exit: 0 when no required check fails, 1 otherwise");
  app.add_flag("--json", check_json, "with --check: print the checks as JSON");
  CLI11_PARSE(app, argc, argv);

  auto loaded = sbx::daemon::Load(cl, Environment());
  if (!loaded.ok()) return Fail(loaded.status());
  if (cl.print_config) {
    for (const auto& w : loaded->warnings) std::cerr << "sbxd: warning: " << w << "\n";
    std::cout << sbx::daemon::ToToml(loaded->config) << std::flush;
    return 0;
  }
  Daemon d;
  d.cfg = loaded->config;
  const Config& cfg = d.cfg;
  const sigset_t stop = BlockSignals();
  if (auto st = InitLog(cfg, loaded->warnings); !st.ok()) return Fail(st);
  d.agent_path = cfg.runtime.agent_path.empty() ? DefaultAgentPath() : cfg.runtime.agent_path;
  const sbx::daemon::PreflightConfig preflight{cfg.state.dir, cfg.runtime.default_runtime,
                                               d.agent_path, cfg.runtime.ns.user_namespaces,
                                               cfg.runtime.ns.seccomp_policy,
                                               cfg.runtime.ns.cgroup_parent,
                                               cfg.admission.max_sandboxes,
                                               cfg.runtime.ns.netns_pool + cfg.runtime.ns.userns_pool +
                                                   cfg.runtime.ns.disk_pool + cfg.runtime.ns.cgroup_pool,
                                               cfg.runtime.microvm.qemu, cfg.runtime.microvm.kernel,
                                               cfg.runtime.microvm.vmm, cfg.runtime.microvm.firecracker,
                                               cfg.runtime.microvm.jailer};
  if (check) return sbx::daemon::RunCheckCommand(preflight, check_json);

  sbx::daemon::RaiseOpenFiles(inherited);
  auto hopts = CheckSettings(cfg);
  if (!hopts.ok()) return Fail(hopts.status());
  // Connections, their reserve and as many spare descriptors (docs/config.md, [server]).
  auto holds = sbx::daemon::ResolveDensity(
      cfg, static_cast<int64_t>(hopts->max_connections + 2 * hopts->reserved_connections + 1));
  if (!holds.ok()) return Fail(holds.status());
  g_host_holds = *holds;
  // A replica of the api tier has no runtime, state or service of its own (docs/scale.md).
  if (cfg.node.role == "api") return sbx::daemon::RunApiRole(cfg, *hopts, stop);
  const sbx::runtime::Resources defaults = DefaultsOf(cfg);
  if (auto st = OpenState(d); !st.ok()) return Fail(st);
  // A host that lacks what the runtime needs is refused here, with the doctor's diagnosis,
  // instead of at the first create.
  if (auto st = sbx::daemon::StartupPreflight(preflight, *d.templates); !st.ok()) return Fail(st);
  if (auto st = StartNetwork(d); !st.ok()) return Fail(st);
  if (auto st = StartRuntime(d); !st.ok()) return Fail(st);
  if (auto st = StartService(d, defaults); !st.ok()) return Fail(st);
  if (auto st = ServeApi(d, *hopts); !st.ok()) return Fail(st);
  auto node = sbx::daemon::StartNodeRole(cfg, *d.store, *d.cluster, *d.svc,
                                         d.template_svc.get(), d.server->port());
  if (!node.ok()) return Fail(node.status());
  d.node = std::move(*node);

  d.svc->StartWarmPools();
  d.svc->StartTimers();
  // glibc gives memory back only from the top of each arena's heap; what a burst of requests
  // freed in the middle of one (per-thread arenas serve the HTTP and operation threads) stays
  // resident. Trimming now and then returns those pages, so sbxd's RSS follows its load
  // down again (the issue 13 soak: +30 MiB after 10 minutes without it).
  sbx::Ticker trim(std::chrono::seconds(10), [] { malloc_trim(0); });
  LogReady(d, *hopts, loaded->file);
  WaitForSignals(stop, cl, d);
  if (d.node.membership) {
    // A stop on purpose: the replicas wait node.restart_grace_ms for this node to be back.
    if (auto st = d.node.membership->Leave(); !st.ok()) {
      spdlog::warn("node: could not record the restart deadline: {}", std::string(st.message()));
    }
  }
  d.node = {};  // no heartbeat of a node that is going away
  d.server->Stop();
  if (d.template_svc) d.template_svc->Stop();  // imports and pulls end within one read
  d.engine->Shutdown();
  return 0;
}
