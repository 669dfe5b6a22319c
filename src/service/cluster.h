// Nodes of a cluster (docs/scale.md): several sbxd on one PostgreSQL store. A node (`--role node`
// or `all`) registers itself and heartbeats with its capacity and load (NodeMembership); api
// replicas (`--role api`) read the nodes to place creates and to find where a sandbox, session
// or operation lives, and declare a silent node lost (Cluster).
//
// The lease: a node's row carries an epoch. Registering takes epoch + 1; declaring the node lost
// takes epoch + 1 too. A node whose heartbeat finds another epoch than the one it registered, or
// its row lost, was fenced: it drops what the store no longer gives it and registers again. The
// store itself refuses what a fenced node could still write late: a lost sandbox stays lost and
// a finished operation stays finished (store.h, PutSandbox and PutOperation).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ticker.h"
#include "service/placement.h"
#include "store/store.h"

namespace sbx::service {

inline constexpr std::string_view kNodeActive = "active";
inline constexpr std::string_view kNodeDraining = "draining";
inline constexpr std::string_view kNodeLost = "lost";

// What a node tells the store at each heartbeat.
struct NodeReport {
  NodeCapacity capacity;
  NodeLoad load;
};

class NodeMembership {
 public:
  struct Options {
    std::string name;
    std::string url;
    std::string role = "all";
    std::chrono::milliseconds heartbeat{2000};
    std::function<NodeReport()> report;
    // Called (on the heartbeat's thread) when the node finds it was fenced, before it registers
    // again: drop every sandbox the store no longer gives this node.
    std::function<void()> on_fenced;
    // node.restart_grace_ms: how long a node stopped on purpose may stay away (Leave).
    std::chrono::milliseconds restart_grace{0};
  };
  NodeMembership(store::Store& store, Options opts);
  ~NodeMembership();

  // Takes the lease (epoch + 1) and writes the first heartbeat. A draining node stays draining.
  absl::Status Register();
  // One heartbeat: the report, if the lease is still this node's; otherwise on_fenced, then
  // Register. Returns whether the node was fenced.
  absl::StatusOr<bool> Heartbeat();
  // Heartbeats every opts.heartbeat until the destructor or Leave.
  void Start();
  // A stop on purpose (SIGTERM; a rolling restart): the heartbeats end and the node's row gets
  // restart_by = now + restart_grace, before which no replica declares it lost and none places
  // a sandbox on it; Register clears it. Nothing when restart_grace is 0 or the lease is gone.
  absl::Status Leave();
  int64_t epoch() const;

 private:
  store::Store& store_;
  const Options opts_;
  mutable std::mutex mu_;
  int64_t epoch_ = 0;
  std::string started_at_;
  std::unique_ptr<Ticker> ticker_;
};

// A node as the api tier sees it.
struct NodeInfo {
  store::NodeRecord record;
  bool fresh = false;        // heartbeat within lost_after, when read
  int64_t heartbeat_age_ms = 0;
  std::optional<std::chrono::system_clock::time_point> heartbeat;  // parsed heartbeat_at
  int64_t sandboxes = 0;     // holding resources, counted in the store
};

class Cluster {
 public:
  struct Options {
    std::chrono::milliseconds lost_after{30000};
    // How long the node list and the id -> node answers are reused before the store is asked
    // again; a sandbox never moves, so its node is kept until the cache is full.
    std::chrono::milliseconds node_cache{500};
  };
  Cluster(store::Store& store, Options opts);

  absl::StatusOr<std::vector<NodeInfo>> ListNodes();

  // Where requests about an object go: its node when that is alive, nullopt when no node holds
  // it (unknown id) or its node is not alive (the caller then asks any live node, which answers
  // from the store: a lost sandbox's state, a finished operation).
  struct Target {
    std::string node;
    std::string url;
  };
  absl::StatusOr<std::optional<Target>> NodeOfSandbox(const std::string& id);
  absl::StatusOr<std::optional<Target>> NodeOfSession(const std::string& id);
  absl::StatusOr<std::optional<Target>> NodeOfOperation(const std::string& id);
  // Where node `name` is now, read from the store (not the cached view); nullopt when it is
  // not alive.
  absl::StatusOr<std::optional<Target>> CurrentTarget(const std::string& name);
  // A live, active node (round robin), for requests about no sandbox; unavailable when none.
  absl::StatusOr<Target> AnyNode(const std::vector<std::string>& except = {});
  // The node a new sandbox goes to (placement.h); no_capacity when none can take it.
  absl::StatusOr<Target> Place(const PlacementRequest& req, std::string* why = nullptr);

  // Placement stops (draining) or resumes (active). NotFound for an unknown node; a lost node
  // cannot be drained or resumed (it registers again by itself).
  absl::StatusOr<store::NodeRecord> SetDraining(const std::string& name, bool draining);
  // The next lookup reads the nodes from the store (a drain went through this replica).
  void Invalidate();
  // That sandbox, session or operation `id` is on `node` (what a node's answer to a create
  // said): its requests need no store lookup.
  void RememberOwner(const std::string& id, const std::string& node);

  // Declares every active or draining node whose heartbeat is older than lost_after lost: its
  // sandboxes become `lost`, its unfinished operations fail and the running sessions of its
  // sandboxes end, all with code node_lost; its epoch moves on. Returns the names declared.
  absl::StatusOr<std::vector<std::string>> DeclareSilentNodesLost(
      std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

 private:
  absl::StatusOr<std::vector<NodeInfo>> Nodes(bool fresh_read);
  // `group`: the anti-affinity counts, read from the store at the first call that needs them.
  absl::StatusOr<Target> PlaceIn(bool fresh_read, const PlacementRequest& req, std::string* why,
                                 std::optional<std::map<std::string, int64_t>>& group);
  bool Alive(const NodeInfo& n) const;
  bool Placeable(const NodeInfo& n) const;
  absl::StatusOr<std::optional<Target>> TargetOfNode(const std::string& node);
  std::optional<std::string> CachedOwner(const std::string& id);
  absl::StatusOr<std::optional<Target>> NodeOf(
      const std::string& id, const std::function<absl::StatusOr<std::string>(store::Tx&)>& lookup);
  absl::Status DeclareLost(const std::string& name, const std::string& why);

  store::Store& store_;
  const Options opts_;
  std::mutex mu_;
  std::vector<NodeInfo> nodes_;
  std::chrono::steady_clock::time_point nodes_read_{};
  std::map<std::string, std::string> owner_;  // sandbox, session or operation id -> node
  uint64_t next_ = 0;
};

}  // namespace sbx::service
