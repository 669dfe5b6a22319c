// Placement (docs/scale.md): which node a new sandbox goes to. A pure function of the nodes'
// last reports and the create's request, so that an api replica decides in microseconds from
// what it read of the store, and tests and benchmarks need no cluster.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace sbx::service {

// What a node reports in its heartbeat.
struct NodeCapacity {
  int64_t vcpu = 0, memory_mib = 0, disk_mib = 0;  // offered to sandboxes in all; 0: no limit
  int64_t max_sandboxes = 0;                       // 0: no limit
  std::vector<std::string> runtimes;               // e.g. {"ns", "microvm"}
  std::vector<std::string> templates;              // "base", "python:3.12", "sha256:..."
  std::map<std::string, int64_t> warm;             // template -> ready warm-pool members
  // What a sandbox holds there when its create names no size (the node's sandbox.defaults):
  // placement charges these for a create's missing vcpu, memory_mib and disk_mib.
  int64_t default_vcpu = 0, default_memory_mib = 0, default_disk_mib = 0;
};
// Held by the live sandboxes on a node.
struct NodeLoad {
  int64_t sandboxes = 0, vcpu = 0, memory_mib = 0, disk_mib = 0;
};
struct PlacementNode {
  std::string name;
  std::string state;  // active | draining | lost
  bool fresh = true;  // heartbeat within the lost-after time
  NodeCapacity capacity;
  NodeLoad load;
  int64_t same_group = 0;  // live sandboxes on it with the request's anti-affinity label
};
struct PlacementRequest {
  std::string runtime;       // "" : any
  std::string template_ref;  // as requested ("base", "python:3.12", "name@sha256:...")
  int64_t vcpu = 0, memory_mib = 0, disk_mib = 0;  // 0: the node's default
  bool anti_affinity = false;  // prefer nodes with the fewest same_group
  // The group anti_affinity counts (Cluster::Place fills same_group from them): the tenant's
  // live sandboxes whose label group_key is group_value.
  std::string tenant, group_key, group_value;
};
struct PlacementDecision {
  std::string node;
  std::string why;  // one line for the log
};

// Hard filters, in order (a node is counted under the first it fails): active and fresh, the
// runtime, a free sandbox slot, vCPU, memory, disk (a capacity of 0 is no limit). Then, smaller
// first: same_group (with anti_affinity), no ready warm member for the template, template not
// held ("base" is held everywhere; "name@sha256:..." is held when its digest is), fill (the
// fullest limited dimension with this sandbox in), the sandbox count, name. O(nodes), no allocation per node.
// None left: ApiError(kUnavailable, "no_capacity", ...) counting the nodes per reason.
absl::StatusOr<PlacementDecision> Place(const std::vector<PlacementNode>& nodes,
                                        const PlacementRequest& req);

// What `req` holds on a node of capacity `c`: each size asked for, else the node's default.
struct Want {
  int64_t vcpu, memory_mib, disk_mib;
};
Want WantOn(const NodeCapacity& c, const PlacementRequest& req);

// The store's form of NodeCapacity: keys vcpu, memory_mib, disk_mib, max_sandboxes, runtimes,
// templates, warm, default_vcpu, default_memory_mib, default_disk_mib. FromJson takes missing keys (and null) as their defaults, refuses wrong
// types with InvalidArgument and never throws.
nlohmann::json CapacityToJson(const NodeCapacity& c);
absl::StatusOr<NodeCapacity> CapacityFromJson(const nlohmann::json& j);

}  // namespace sbx::service
