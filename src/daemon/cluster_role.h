// sbxd's place in a cluster (docs/scale.md, config [node]): the node's name and URL, its
// registration and heartbeat (role all or node), and the whole of the api role.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/ticker.h"
#include "daemon/config.h"
#include "http/server.h"
#include "service/cluster.h"
#include "service/sandbox_service.h"
#include "service/template_service.h"
#include "store/store.h"

namespace sbx::daemon {

// node.name, or the host name.
std::string NodeNameOf(const Config& cfg);
// node.url, or http://<listen address>:<bound port> (a wildcard address: the host name).
std::string NodeUrlOf(const Config& cfg, uint16_t bound_port);

// A node's registration and heartbeat, and (on a shared store, role all) the declaring of
// silent nodes lost. Destroy before the service it reports on.
struct NodeRole {
  std::unique_ptr<service::NodeMembership> membership;
  std::unique_ptr<Ticker> reaper;
};
// The view of the nodes (for /v1/admin/nodes and the reaper).
std::unique_ptr<service::Cluster> MakeCluster(const Config& cfg, store::Store& store);
// `templates` (may be null): its tags follow the store's from the heartbeat
// (TemplateService::SyncTagsFromStore), at most every kTagSyncEvery.
absl::StatusOr<NodeRole> StartNodeRole(const Config& cfg, store::Store& store,
                                       service::Cluster& cluster, service::SandboxService& svc,
                                       service::TemplateService* templates, uint16_t bound_port);
// One read of every tag per node: at 1,000 nodes, 100 reads a second (docs/scale.md).
inline constexpr std::chrono::seconds kTagSyncEvery{10};

// `sbxd --role api`: serves until SIGTERM or SIGINT; the exit code.
int RunApiRole(const Config& cfg, http::ServerOptions hopts, const sigset_t& stop);

}  // namespace sbx::daemon
