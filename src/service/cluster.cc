#include "service/cluster.h"

#include <fmt/format.h>

#include <algorithm>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "common/time_util.h"
#include "service/sandbox_state.h"

namespace sbx::service {

using store::NodeRecord;
using store::Tx;

namespace {

// A bound on the id -> node answers kept (each a few dozen bytes); past it they are all
// dropped and asked again.
constexpr size_t kMaxOwners = 100000;

nlohmann::json LoadToJson(const NodeLoad& l) {
  return {{"sandboxes", l.sandboxes}, {"vcpu", l.vcpu}, {"memory_mib", l.memory_mib},
          {"disk_mib", l.disk_mib}};
}

NodeLoad LoadFromJson(const nlohmann::json& j) {
  NodeLoad l;
  if (!j.is_object()) return l;
  auto num = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{0};
  };
  l.sandboxes = num("sandboxes");
  l.vcpu = num("vcpu");
  l.memory_mib = num("memory_mib");
  l.disk_mib = num("disk_mib");
  return l;
}

// A node stopped on purpose (NodeMembership::Leave) and not back yet, before its deadline.
bool RestartPending(const NodeRecord& r, std::chrono::system_clock::time_point now) {
  if (r.restart_by.empty()) return false;
  auto by = ParseRfc3339(r.restart_by);
  return by && now < *by;
}

nlohmann::json NodeLostError(const std::string& node, const std::string& why) {
  return {{"code", "node_lost"}, {"message", fmt::format("node {} was lost: {}", node, why)}};
}

}  // namespace

// ---- NodeMembership ----

NodeMembership::NodeMembership(store::Store& store, Options opts)
    : store_(store), opts_(std::move(opts)) {}

NodeMembership::~NodeMembership() { ticker_.reset(); }

int64_t NodeMembership::epoch() const {
  std::lock_guard lock(mu_);
  return epoch_;
}

absl::Status NodeMembership::Register() {
  const NodeReport report = opts_.report ? opts_.report() : NodeReport{};
  const std::string now = NowRfc3339();
  int64_t epoch = 0;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    NodeRecord rec;
    auto old = tx.GetNode(opts_.name);
    if (old.ok()) {
      rec = *old;
    } else if (!absl::IsNotFound(old.status())) {
      return old.status();
    }
    rec.name = opts_.name;
    rec.url = opts_.url;
    rec.role = opts_.role;
    // Draining is the operator's decision and outlives a restart; lost is over once back.
    if (rec.state != kNodeDraining) {
      rec.state = std::string(kNodeActive);
      rec.reason.clear();
    }
    rec.epoch += 1;
    epoch = rec.epoch;
    rec.restart_by.clear();  // back
    rec.heartbeat_at = now;
    rec.started_at = now;
    rec.capacity = CapacityToJson(report.capacity);
    rec.load = LoadToJson(report.load);
    return tx.PutNode(rec);
  }));
  {
    std::lock_guard lock(mu_);
    epoch_ = epoch;
    started_at_ = now;
  }
  spdlog::info("node {}: registered at {} with epoch {}", opts_.name, opts_.url, epoch);
  return absl::OkStatus();
}

absl::StatusOr<bool> NodeMembership::Heartbeat() {
  const NodeReport report = opts_.report ? opts_.report() : NodeReport{};
  const int64_t mine = epoch();
  bool fenced = false;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    fenced = false;
    auto rec = tx.GetNode(opts_.name);
    if (absl::IsNotFound(rec.status())) {
      fenced = true;  // removed by hand: registering again restores it
      return absl::OkStatus();
    }
    SBX_RETURN_IF_ERROR(rec.status());
    if (rec->epoch != mine || rec->state == kNodeLost) {
      fenced = true;
      return absl::OkStatus();
    }
    rec->heartbeat_at = NowRfc3339();
    rec->capacity = CapacityToJson(report.capacity);
    rec->load = LoadToJson(report.load);
    return tx.PutNode(*rec);
  }));
  if (!fenced) return false;
  spdlog::warn("node {}: lease lost (epoch {} is no longer the store's): dropping what the store "
               "no longer gives this node, then registering again",
               opts_.name, mine);
  if (opts_.on_fenced) opts_.on_fenced();
  SBX_RETURN_IF_ERROR(Register());
  return true;
}

absl::Status NodeMembership::Leave() {
  ticker_.reset();  // no heartbeat after this (it would keep the deadline of a node that is up)
  if (opts_.restart_grace.count() <= 0) return absl::OkStatus();
  const int64_t mine = epoch();
  const auto by = std::chrono::system_clock::now() + opts_.restart_grace;
  const std::string by_text = FormatRfc3339(by);
  bool written = false;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    written = false;
    auto rec = tx.GetNode(opts_.name);
    if (absl::IsNotFound(rec.status())) return absl::OkStatus();
    SBX_RETURN_IF_ERROR(rec.status());
    // Fenced meanwhile: the deadline is not this process's to set.
    if (rec->epoch != mine || rec->state == kNodeLost) return absl::OkStatus();
    rec->restart_by = by_text;
    written = true;
    return tx.PutNode(*rec);
  }));
  if (written) {
    spdlog::info("node {}: stopping; it is not declared lost before {} (node.restart_grace_ms), "
                 "and nothing is placed on it until it is back",
                 opts_.name, by_text);
  }
  return absl::OkStatus();
}

void NodeMembership::Start() {
  ticker_ = std::make_unique<Ticker>(opts_.heartbeat, [this] {
    if (auto st = Heartbeat(); !st.ok()) {
      spdlog::warn("node {}: heartbeat: {}", opts_.name, std::string(st.status().message()));
    }
  });
}

// ---- Cluster ----

Cluster::Cluster(store::Store& store, Options opts) : store_(store), opts_(opts) {}

absl::StatusOr<std::vector<NodeInfo>> Cluster::Nodes(bool fresh_read) {
  const auto mono = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    if (!fresh_read && mono - nodes_read_ < opts_.node_cache) return nodes_;
  }
  std::vector<NodeRecord> rows;
  std::map<std::string, int64_t> counts;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(rows, tx.ListNodes());
    SBX_ASSIGN_OR_RETURN(counts, tx.CountHeldSandboxesByNode());
    return absl::OkStatus();
  }));
  const auto now = std::chrono::system_clock::now();
  std::vector<NodeInfo> out;
  out.reserve(rows.size());
  for (NodeRecord& r : rows) {
    NodeInfo n;
    auto at = ParseRfc3339(r.heartbeat_at);
    n.heartbeat = at;
    n.heartbeat_age_ms =
        at ? std::chrono::duration_cast<std::chrono::milliseconds>(now - *at).count() : INT64_MAX;
    n.fresh = at && n.heartbeat_age_ms <= opts_.lost_after.count();
    auto c = counts.find(r.name);
    n.sandboxes = c == counts.end() ? 0 : c->second;
    n.record = std::move(r);
    out.push_back(std::move(n));
  }
  std::lock_guard lock(mu_);
  nodes_ = out;
  nodes_read_ = mono;
  return out;
}

// Judged now, not when the view was read: a view kept for node_cache must not keep a node that
// went silent meanwhile alive.
// A node away for a restart stays alive for its sandboxes' requests (forwarded: they fail as
// 502 node_unreachable, which clients retry, until it is back) but takes nothing new
// (Placeable).
bool Cluster::Alive(const NodeInfo& n) const {
  const auto now = std::chrono::system_clock::now();
  return n.record.state != kNodeLost &&
         ((n.heartbeat && now - *n.heartbeat <= opts_.lost_after) ||
          RestartPending(n.record, now));
}

bool Cluster::Placeable(const NodeInfo& n) const {
  return Alive(n) && !RestartPending(n.record, std::chrono::system_clock::now());
}

absl::StatusOr<std::vector<NodeInfo>> Cluster::ListNodes() { return Nodes(/*fresh_read=*/true); }

absl::StatusOr<std::optional<Cluster::Target>> Cluster::TargetOfNode(const std::string& node) {
  SBX_ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, Nodes(false));
  for (const NodeInfo& n : nodes) {
    if (n.record.name != node) continue;
    // A draining node still serves its sandboxes; a lost or silent one cannot.
    if (!Alive(n)) return std::nullopt;
    return Target{n.record.name, n.record.url};
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<Cluster::Target>> Cluster::CurrentTarget(const std::string& name) {
  SBX_RETURN_IF_ERROR(Nodes(/*fresh_read=*/true).status());
  return TargetOfNode(name);
}

std::optional<std::string> Cluster::CachedOwner(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = owner_.find(id);
  if (it == owner_.end()) return std::nullopt;
  return it->second;
}

void Cluster::RememberOwner(const std::string& id, const std::string& node) {
  std::lock_guard lock(mu_);
  if (owner_.size() >= kMaxOwners) owner_.clear();
  owner_[id] = node;
}

// Sandboxes never move, and neither do a session's sandbox and an operation's node: the answer
// is kept (the node's liveness is looked up each time, from the node view).
absl::StatusOr<std::optional<Cluster::Target>> Cluster::NodeOf(
    const std::string& id, const std::function<absl::StatusOr<std::string>(Tx&)>& lookup) {
  std::optional<std::string> node = CachedOwner(id);
  if (!node) {
    std::string found;
    SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
      auto n = lookup(tx);
      if (absl::IsNotFound(n.status())) {
        found.clear();
        return absl::OkStatus();
      }
      SBX_RETURN_IF_ERROR(n.status());
      found = *n;
      return absl::OkStatus();
    }));
    if (found.empty()) return std::nullopt;
    RememberOwner(id, found);
    node = found;
  }
  return TargetOfNode(*node);
}

absl::StatusOr<std::optional<Cluster::Target>> Cluster::NodeOfSandbox(const std::string& id) {
  return NodeOf(id, [&](Tx& tx) -> absl::StatusOr<std::string> {
    SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(id));
    return sb.node;
  });
}

absl::StatusOr<std::optional<Cluster::Target>> Cluster::NodeOfSession(const std::string& id) {
  return NodeOf(id, [&](Tx& tx) -> absl::StatusOr<std::string> {
    SBX_ASSIGN_OR_RETURN(store::SessionRecord s, tx.GetSession(id));
    SBX_ASSIGN_OR_RETURN(store::SandboxRecord sb, tx.GetSandbox(s.sandbox_id));
    return sb.node;
  });
}

absl::StatusOr<std::optional<Cluster::Target>> Cluster::NodeOfOperation(const std::string& id) {
  return NodeOf(id, [&](Tx& tx) -> absl::StatusOr<std::string> {
    SBX_ASSIGN_OR_RETURN(store::OperationRecord op, tx.GetOperation(id));
    return op.node;
  });
}

absl::StatusOr<Cluster::Target> Cluster::AnyNode(const std::vector<std::string>& except) {
  SBX_ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, Nodes(false));
  std::vector<const NodeInfo*> live;
  for (const NodeInfo& n : nodes) {
    if (Placeable(n) && std::find(except.begin(), except.end(), n.record.name) == except.end()) {
      live.push_back(&n);
    }
  }
  if (live.empty()) {
    return ApiError(absl::StatusCode::kUnavailable, "no_node",
                    fmt::format("no node is alive to serve this ({} registered)", nodes.size()));
  }
  std::lock_guard lock(mu_);
  const NodeInfo* n = live[next_++ % live.size()];
  return Target{n->record.name, n->record.url};
}

absl::StatusOr<Cluster::Target> Cluster::Place(const PlacementRequest& req, std::string* why) {
  std::optional<std::map<std::string, int64_t>> group;  // read once for both tries
  auto placed = PlaceIn(/*fresh_read=*/false, req, why, group);
  // The cached view carries this replica's own estimates (each placement charged at once, no
  // delete ever subtracted): under churn it overstates the load. A refusal is only given on
  // what the store says now.
  if (!placed.ok() && ApiErrorCode(placed.status()) == "no_capacity") {
    return PlaceIn(/*fresh_read=*/true, req, why, group);
  }
  return placed;
}

absl::StatusOr<Cluster::Target> Cluster::PlaceIn(
    bool fresh_read, const PlacementRequest& req, std::string* why,
    std::optional<std::map<std::string, int64_t>>& group) {
  SBX_ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, Nodes(fresh_read));
  std::vector<PlacementNode> candidates;
  candidates.reserve(nodes.size());
  for (const NodeInfo& n : nodes) {
    PlacementNode p;
    p.name = n.record.name;
    p.state = n.record.state;
    p.fresh = Placeable(n);
    auto cap = CapacityFromJson(n.record.capacity);
    if (cap.ok()) p.capacity = std::move(*cap);
    p.load = LoadFromJson(n.record.load);
    // The store's count is newer than the last heartbeat's: sandboxes made since the node
    // reported are charged their size there (as the node's defaults: the rows' sizes would
    // cost a read per placement), or a burst through several replicas piles onto one node.
    if (const int64_t unreported = n.sandboxes - p.load.sandboxes; unreported > 0) {
      const Want w = WantOn(p.capacity, PlacementRequest{});
      p.load.sandboxes = n.sandboxes;
      p.load.vcpu += unreported * w.vcpu;
      p.load.memory_mib += unreported * w.memory_mib;
      p.load.disk_mib += unreported * w.disk_mib;
    }
    candidates.push_back(std::move(p));
  }
  if (req.anti_affinity && !req.tenant.empty()) {
    // Read fresh, not from the cached view: a client spreading a group creates its members one
    // after another, each seeing the one before.
    if (!group) {
      SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
        SBX_ASSIGN_OR_RETURN(group, tx.CountLabelledSandboxesByNode(req.tenant, req.group_key,
                                                                    req.group_value));
        return absl::OkStatus();
      }));
    }
    for (PlacementNode& p : candidates) {
      auto it = group->find(p.name);
      p.same_group = it == group->end() ? 0 : it->second;
    }
  }
  SBX_ASSIGN_OR_RETURN(PlacementDecision d, service::Place(candidates, req));
  if (why != nullptr) *why = d.why;
  {
    // Counted at once in the cached view: the next creates through this replica, before the
    // node's heartbeat or the store says so, see the node a sandbox fuller (a burst would
    // otherwise all go to one node).
    std::lock_guard lock(mu_);
    for (NodeInfo& n : nodes_) {
      if (n.record.name != d.node) continue;
      ++n.sandboxes;
      nlohmann::json& load = n.record.load;
      if (!load.is_object()) load = nlohmann::json::object();
      // What the node will charge: a create that names no size gets the node's defaults.
      NodeCapacity chosen;
      for (const PlacementNode& p : candidates) {
        if (p.name == d.node) chosen = p.capacity;
      }
      const Want w = WantOn(chosen, req);
      load["sandboxes"] = load.value("sandboxes", int64_t{0}) + 1;
      load["vcpu"] = load.value("vcpu", int64_t{0}) + w.vcpu;
      load["memory_mib"] = load.value("memory_mib", int64_t{0}) + w.memory_mib;
      load["disk_mib"] = load.value("disk_mib", int64_t{0}) + w.disk_mib;
      nlohmann::json& cap = n.record.capacity;
      if (cap.is_object() && cap.contains("warm") && cap["warm"].is_object()) {
        nlohmann::json& w = cap["warm"];
        if (auto it = w.find(req.template_ref); it != w.end() && it->is_number_integer() &&
                                                it->get<int64_t>() > 0) {
          *it = it->get<int64_t>() - 1;
        }
      }
    }
  }
  for (const NodeInfo& n : nodes) {
    if (n.record.name == d.node) return Target{n.record.name, n.record.url};
  }
  return absl::InternalError("placement chose a node that is not listed");
}

absl::StatusOr<NodeRecord> Cluster::SetDraining(const std::string& name, bool draining) {
  NodeRecord out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    auto rec = tx.GetNode(name);
    if (absl::IsNotFound(rec.status())) {
      return ApiError(absl::StatusCode::kNotFound, "not_found",
                      fmt::format("node {} not found", name));
    }
    SBX_RETURN_IF_ERROR(rec.status());
    if (rec->state == kNodeLost) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "invalid_state",
                      fmt::format("node {} is lost: it becomes active again when it registers",
                                  name));
    }
    rec->state = std::string(draining ? kNodeDraining : kNodeActive);
    rec->reason = draining ? "drained by an operator" : "";
    out = *rec;
    return tx.PutNode(*rec);
  }));
  std::lock_guard lock(mu_);
  nodes_read_ = {};  // placement sees it at once
  return out;
}

void Cluster::Invalidate() {
  std::lock_guard lock(mu_);
  nodes_read_ = {};
}

absl::Status Cluster::DeclareLost(const std::string& name, const std::string& why) {
  int64_t sandboxes = 0, operations = 0;
  bool declared = false;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    sandboxes = operations = 0;
    declared = false;
    SBX_ASSIGN_OR_RETURN(NodeRecord rec, tx.GetNode(name));
    // Read again inside the transaction: another replica may have declared it, or the node
    // may have heartbeated since the caller looked.
    auto at = ParseRfc3339(rec.heartbeat_at);
    const auto now_tp = std::chrono::system_clock::now();
    if (rec.state == kNodeLost || (at && now_tp - *at <= opts_.lost_after) ||
        RestartPending(rec, now_tp)) {
      return absl::OkStatus();
    }
    declared = true;
    const std::string now = NowRfc3339();
    rec.state = std::string(kNodeLost);
    rec.epoch += 1;
    rec.reason = why;
    SBX_RETURN_IF_ERROR(tx.PutNode(rec));
    const nlohmann::json err = NodeLostError(name, why);
    SBX_ASSIGN_OR_RETURN(auto live, tx.ListLiveSandboxes(name));
    for (store::SandboxRecord& sb : live) {
      if (sb.state == kFailed || sb.state == kLost) continue;
      sb.state = std::string(kLost);
      sb.error = err;
      sb.current_operation_id.reset();
      sb.updated_at = now;
      SBX_RETURN_IF_ERROR(tx.PutSandbox(sb));
      ++sandboxes;
      SBX_ASSIGN_OR_RETURN(auto sessions, tx.ListSessions(sb.id));
      for (store::SessionRecord& s : sessions) {
        if (s.state == "exited") continue;
        s.state = "exited";
        s.exited_at = now;
        s.error = err;
        SBX_RETURN_IF_ERROR(tx.PutSession(s));
      }
    }
    SBX_ASSIGN_OR_RETURN(auto ops, tx.ListUnfinishedOperations(name));
    for (store::OperationRecord& op : ops) {
      op.state = "failed";
      op.error = err;
      op.updated_at = now;
      op.completed_at = now;
      SBX_RETURN_IF_ERROR(tx.PutOperation(op));
      ++operations;
    }
    return absl::OkStatus();
  }));
  if (declared) {
    spdlog::warn("node {} declared lost ({}): {} sandboxes lost, {} operations failed", name, why,
                 sandboxes, operations);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Cluster::DeclareSilentNodesLost(
    std::chrono::system_clock::time_point now) {
  SBX_ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, Nodes(true));
  std::vector<std::string> out;
  for (const NodeInfo& n : nodes) {
    if (n.record.state == kNodeLost || RestartPending(n.record, now)) continue;
    auto at = ParseRfc3339(n.record.heartbeat_at);
    if (at && now - *at <= opts_.lost_after) continue;
    const std::string why =
        n.record.restart_by.empty()
            ? fmt::format("no heartbeat for {} ms (the limit is {} ms; last at {})",
                          n.heartbeat_age_ms, opts_.lost_after.count(), n.record.heartbeat_at)
            : fmt::format("stopped for a restart and not back by {} (last heartbeat at {})",
                          n.record.restart_by, n.record.heartbeat_at);
    SBX_RETURN_IF_ERROR(DeclareLost(n.record.name, why));
    out.push_back(n.record.name);
  }
  if (!out.empty()) {
    std::lock_guard lock(mu_);
    nodes_read_ = {};
  }
  return out;
}

}  // namespace sbx::service
