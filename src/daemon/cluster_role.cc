#include "daemon/cluster_role.h"

#include <strings.h>
#include <unistd.h>

#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/cluster_router.h"
#include "api/status_to_http.h"
#include "common/digest.h"
#include "common/metrics.h"
#include "common/status_util.h"
#include "service/tenancy.h"
#include "store/open_store.h"

namespace sbx::daemon {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

service::Cluster::Options ClusterOptionsOf(const Config& cfg) {
  service::Cluster::Options o;
  o.lost_after = std::chrono::milliseconds(cfg.node.lost_after_ms);
  return o;
}

// Declares silent nodes lost every heartbeat interval.
std::unique_ptr<Ticker> StartReaper(const Config& cfg, service::Cluster& cluster) {
  return std::make_unique<Ticker>(std::chrono::milliseconds(cfg.node.heartbeat_ms), [&cluster] {
    auto lost = cluster.DeclareSilentNodesLost();
    if (!lost.ok()) {
      spdlog::warn("cluster: checking the nodes' heartbeats: {}",
                   std::string(lost.status().message()));
    }
  });
}

// sbx_node_info{node, role} 1: every series of this process joins its node by instance.
void PublishNodeInfo(const std::string& node, const std::string& role) {
  metrics::Default()
      .AddGauge("sbx_node_info", "Always 1: the node name and role of this sbxd (docs/scale.md).",
                {"node", "role"})
      .WithLabels({node, role})
      .Set(1);
}

}  // namespace

std::string NodeNameOf(const Config& cfg) {
  return cfg.node.name.empty() ? HostName() : cfg.node.name;
}

std::string NodeUrlOf(const Config& cfg, uint16_t bound_port) {
  if (!cfg.node.url.empty()) return cfg.node.url;
  std::string host = cfg.server.listen.substr(0, cfg.server.listen.rfind(':'));
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0" || host == "::") host = HostName();
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return fmt::format("http://{}:{}", host, bound_port);
}

std::unique_ptr<service::Cluster> MakeCluster(const Config& cfg, store::Store& store) {
  return std::make_unique<service::Cluster>(store, ClusterOptionsOf(cfg));
}

absl::StatusOr<NodeRole> StartNodeRole(const Config& cfg, store::Store& store,
                                       service::Cluster& cluster, service::SandboxService& svc,
                                       service::TemplateService* templates, uint16_t bound_port) {
  NodeRole role;
  service::NodeMembership::Options mo;
  mo.name = NodeNameOf(cfg);
  mo.url = NodeUrlOf(cfg, bound_port);
  mo.role = cfg.node.role;
  mo.heartbeat = std::chrono::milliseconds(cfg.node.heartbeat_ms);
  mo.restart_grace = std::chrono::milliseconds(cfg.node.restart_grace_ms);
  // Register and the heartbeat thread call it one after another, never at once: `last_sync`
  // needs no lock.
  mo.report = [&svc, templates,
               last_sync = std::chrono::steady_clock::time_point()]() mutable {
    const auto now = std::chrono::steady_clock::now();
    if (templates != nullptr && now - last_sync >= kTagSyncEvery) {
      last_sync = now;
      auto changed = templates->SyncTagsFromStore();
      if (!changed.ok()) {
        spdlog::warn("template tags: reading them from the store failed: {}; reported as they "
                     "were", std::string(changed.status().message()));
      } else if (*changed > 0) {
        spdlog::info("template tags: {} changed on other nodes, followed here", *changed);
      }
    }
    return svc.Report();
  };
  mo.on_fenced = [&svc] {
    const int n = svc.ReleaseUnowned();
    spdlog::warn("node fenced: {} sandboxes the store no longer gives this node were destroyed", n);
  };
  PublishNodeInfo(mo.name, cfg.node.role);
  role.membership = std::make_unique<service::NodeMembership>(store, std::move(mo));
  SBX_RETURN_IF_ERROR(Annotate(role.membership->Register(), "register the node"));
  role.membership->Start();
  // Only where other processes share the store is there anyone else to declare lost.
  if (cfg.store.url.rfind("postgres", 0) == 0 && cfg.node.role == "all") {
    role.reaper = StartReaper(cfg, cluster);
  }
  return role;
}

namespace {

// The tenant of a request's bearer token, as a node would authenticate it (api.cc): a
// management token by its row, else the configured admin token.
std::function<absl::StatusOr<std::string>(const http::Request&)> TenantOfRequest(
    store::Store& store, const std::string& admin_token) {
  auto tenancy = std::make_shared<service::Tenancy>(store, service::TenancyOptions{});
  const std::string admin_hash = admin_token.empty() ? "" : Sha256Hex(admin_token);
  return [tenancy, admin_hash](const http::Request& req) -> absl::StatusOr<std::string> {
    constexpr std::string_view kBearer = "Bearer ";
    auto it = req.find(boost::beast::http::field::authorization);
    if (it == req.end() || it->value().size() <= kBearer.size() ||
        strncasecmp(it->value().data(), kBearer.data(), kBearer.size()) != 0) {
      return absl::UnauthenticatedError("no bearer token");
    }
    const std::string token(it->value().substr(kBearer.size()));
    if (token.rfind(service::kMgmtTokenPrefix, 0) == 0) {
      SBX_ASSIGN_OR_RETURN(service::Principal p,
                           tenancy->Authenticate(token, std::chrono::system_clock::now()));
      return p.caller.tenant_id;
    }
    if (admin_hash.empty() || !ConstantTimeEquals(Sha256Hex(token), admin_hash)) {
      return absl::UnauthenticatedError("invalid token");
    }
    return tenancy->Bootstrap().caller.tenant_id;
  };
}

}  // namespace

int RunApiRole(const Config& cfg, http::ServerOptions hopts, const sigset_t& stop) {
  const store::StoreConfig store_cfg{cfg.store.url, static_cast<int>(cfg.store.pool_size)};
  auto store = store::OpenStore(store_cfg, cfg.state.dir);
  if (!store.ok()) {
    spdlog::critical("sbxd: {}", std::string(store.status().message()));
    std::cerr << "sbxd: " << store.status().message() << std::endl;
    return 1;
  }
  spdlog::info("role api: store {}", store::DescribeStore(store_cfg, cfg.state.dir));
  service::Cluster cluster(**store, ClusterOptionsOf(cfg));
  PublishNodeInfo(NodeNameOf(cfg), "api");
  api::ClusterRouterOptions ro;
  ro.ports_domain = cfg.ports.domain;
  ro.connect_timeout = std::chrono::milliseconds(cfg.ports.connect_timeout_ms);
  ro.idle_timeout = std::chrono::seconds(cfg.ports.idle_timeout_s);
  ro.tenant_of = TenantOfRequest(**store, cfg.server.admin_token);
  api::ClusterRouter router(cluster, ro);
  hopts.stream_body = [](const http::Request& req) { return api::ClusterRouter::StreamsBody(req); };
  hopts.privileged = [](const http::Request& req) {
    const std::string_view t(req.target().data(), req.target().size());
    return t.rfind("/healthz", 0) == 0 || t.rfind("/readyz", 0) == 0;
  };
  http::Server server(hopts, [&router](http::RequestContext& ctx) { return router.Handle(ctx); },
                      api::RawErrorResponse);
  if (auto st = server.Listen(); !st.ok()) {
    std::cerr << "sbxd: " << st.message() << std::endl;
    return 1;
  }
  server.Start();
  auto reaper = StartReaper(cfg, cluster);
  std::string host = hopts.host.find(':') != std::string::npos ? "[" + hopts.host + "]" : hopts.host;
  std::cout << "sbxd listening on " << (server.tls() ? "https://" : "http://") << host << ":"
            << server.port() << std::endl;
  spdlog::info("sbxd ready: role api, nodes lost after {} ms of silence", cfg.node.lost_after_ms);
  for (;;) {
    int sig = 0;
    sigwait(&stop, &sig);
    if (sig == SIGHUP) {
      spdlog::info("SIGHUP: the api role has nothing to reload");
      continue;
    }
    spdlog::info("signal {}: stopping the api replica", sig);
    break;
  }
  reaper.reset();
  server.Stop();
  return 0;
}

}  // namespace sbx::daemon
