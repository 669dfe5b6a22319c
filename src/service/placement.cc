#include "service/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include "common/status_util.h"

namespace sbx::service {
namespace {

// Why a node cannot take the sandbox: the first filter it fails, in this order.
enum Excluded { kSilent, kDraining, kRuntime, kFull, kVcpu, kMemory, kDisk, kReasons };
constexpr std::array<std::string_view, kReasons> kWhy = {
    "lost or not heartbeating", "draining", "without runtime", "at their sandbox limit",
    "without the vCPUs", "without the memory", "without the disk"};

bool Fits(int64_t load, int64_t want, int64_t cap) { return cap <= 0 || load + want <= cap; }

double Fraction(int64_t load, int64_t want, int64_t cap) {
  return cap <= 0 ? 0.0 : static_cast<double>(load + want) / static_cast<double>(cap);
}

// "base" is on every node. Nodes report "name:tag" and bare digests ("sha256:..."), so a
// pinned "name@sha256:..." is held when its digest is.
bool Holds(const NodeCapacity& c, const std::string& ref) {
  if (ref == "base") return true;
  const size_t at = ref.find('@');
  const std::string_view digest =
      at == std::string::npos ? std::string_view() : std::string_view(ref).substr(at + 1);
  for (const std::string& t : c.templates) {
    if (t == ref || (!digest.empty() && t == digest)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<PlacementDecision> Place(const std::vector<PlacementNode>& nodes,
                                        const PlacementRequest& req) {
  std::array<int, kReasons> excluded{};
  const PlacementNode* best = nullptr;
  // The preference, compared lexicographically: smaller is better.
  struct Score {
    int64_t group;
    int warm, cached;  // 0 when it has it
    double fill;
    // Where no dimension is limited every fill is 0: the count still spreads a burst (the
    // replica counts each placement at once, before any heartbeat tells it).
    int64_t sandboxes;
    bool operator<(const Score& o) const {
      if (group != o.group) return group < o.group;
      if (warm != o.warm) return warm < o.warm;
      if (cached != o.cached) return cached < o.cached;
      if (fill != o.fill) return fill < o.fill;
      return sandboxes < o.sandboxes;
    }
  } best_score{};
  for (const PlacementNode& n : nodes) {
    const NodeCapacity& c = n.capacity;
    const NodeLoad& l = n.load;
    int why = -1;
    if (n.state == "lost" || !n.fresh) {
      why = kSilent;
    } else if (n.state != "active") {
      why = kDraining;
    } else if (!req.runtime.empty() &&
               std::find(c.runtimes.begin(), c.runtimes.end(), req.runtime) == c.runtimes.end()) {
      why = kRuntime;
    } else if (!Fits(l.sandboxes, 1, c.max_sandboxes)) {
      why = kFull;
    } else if (!Fits(l.vcpu, WantOn(c, req).vcpu, c.vcpu)) {
      why = kVcpu;
    } else if (!Fits(l.memory_mib, WantOn(c, req).memory_mib, c.memory_mib)) {
      why = kMemory;
    } else if (!Fits(l.disk_mib, WantOn(c, req).disk_mib, c.disk_mib)) {
      why = kDisk;
    }
    if (why >= 0) {
      ++excluded[why];
      continue;
    }
    auto warm = c.warm.find(req.template_ref);
    // fill: the fullest limited dimension once this sandbox is in (the count too, as +1).
    Score s{req.anti_affinity ? n.same_group : 0, warm != c.warm.end() && warm->second > 0 ? 0 : 1,
            Holds(c, req.template_ref) ? 0 : 1,
            std::max({Fraction(l.sandboxes, 1, c.max_sandboxes),
                      Fraction(l.vcpu, WantOn(c, req).vcpu, c.vcpu),
                      Fraction(l.memory_mib, WantOn(c, req).memory_mib, c.memory_mib),
                      Fraction(l.disk_mib, WantOn(c, req).disk_mib, c.disk_mib)}),
            l.sandboxes};
    if (best == nullptr || s < best_score ||
        (!(best_score < s) && n.name < best->name)) {
      best = &n;
      best_score = s;
    }
  }
  if (best == nullptr) {
    if (nodes.empty()) {
      return ApiError(absl::StatusCode::kUnavailable, "no_capacity",
                      "no node can take this sandbox: no node is registered");
    }
    std::string msg = fmt::format("no node can take this sandbox: {} node{} registered",
                                  nodes.size(), nodes.size() == 1 ? "" : "s");
    const char* sep = "; ";
    for (int i = 0; i < kReasons; ++i) {
      if (excluded[i] == 0) continue;
      msg += fmt::format("{}{} {}", sep, excluded[i], kWhy[i]);
      sep = ", ";
      if (i == kRuntime) msg += " " + req.runtime;
    }
    return ApiError(absl::StatusCode::kUnavailable, "no_capacity", msg);
  }
  const NodeCapacity& c = best->capacity;
  std::string why = fmt::format(
      "{}{}{}, {}{} sandboxes, {:.0f}% full",
      req.anti_affinity ? fmt::format("{} of its group, ", best_score.group) : std::string(),
      best_score.warm == 0 ? "warm pool hit, " : "",
      best_score.cached == 0 ? "template cached" : "template not cached", best->load.sandboxes,
      c.max_sandboxes > 0 ? fmt::format("/{}", c.max_sandboxes) : std::string(),
      best_score.fill * 100);
  return PlacementDecision{best->name, std::move(why)};
}

Want WantOn(const NodeCapacity& c, const PlacementRequest& req) {
  return {req.vcpu > 0 ? req.vcpu : c.default_vcpu,
          req.memory_mib > 0 ? req.memory_mib : c.default_memory_mib,
          req.disk_mib > 0 ? req.disk_mib : c.default_disk_mib};
}

nlohmann::json CapacityToJson(const NodeCapacity& c) {
  return {{"vcpu", c.vcpu},
          {"memory_mib", c.memory_mib},
          {"disk_mib", c.disk_mib},
          {"max_sandboxes", c.max_sandboxes},
          {"runtimes", c.runtimes},
          {"templates", c.templates},
          {"warm", c.warm},
          {"default_vcpu", c.default_vcpu},
          {"default_memory_mib", c.default_memory_mib},
          {"default_disk_mib", c.default_disk_mib}};
}

absl::StatusOr<NodeCapacity> CapacityFromJson(const nlohmann::json& j) {
  NodeCapacity c;
  if (j.is_null()) return c;
  if (!j.is_object()) return absl::InvalidArgumentError("node capacity: not an object");
  auto num = [&](const char* k, int64_t& out) -> absl::Status {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX})) {
      return absl::InvalidArgumentError(fmt::format("node capacity: {} is not an integer", k));
    }
    out = it->get<int64_t>();
    return absl::OkStatus();
  };
  auto strings = [&](const char* k, std::vector<std::string>& out) -> absl::Status {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_array()) return absl::InvalidArgumentError(fmt::format("node capacity: {} is not a list", k));
    for (const auto& v : *it) {
      if (!v.is_string()) {
        return absl::InvalidArgumentError(fmt::format("node capacity: {} holds a non-string", k));
      }
      out.push_back(v.get<std::string>());
    }
    return absl::OkStatus();
  };
  SBX_RETURN_IF_ERROR(num("vcpu", c.vcpu));
  SBX_RETURN_IF_ERROR(num("memory_mib", c.memory_mib));
  SBX_RETURN_IF_ERROR(num("disk_mib", c.disk_mib));
  SBX_RETURN_IF_ERROR(num("max_sandboxes", c.max_sandboxes));
  SBX_RETURN_IF_ERROR(num("default_vcpu", c.default_vcpu));
  SBX_RETURN_IF_ERROR(num("default_memory_mib", c.default_memory_mib));
  SBX_RETURN_IF_ERROR(num("default_disk_mib", c.default_disk_mib));
  SBX_RETURN_IF_ERROR(strings("runtimes", c.runtimes));
  SBX_RETURN_IF_ERROR(strings("templates", c.templates));
  if (auto it = j.find("warm"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return absl::InvalidArgumentError("node capacity: warm is not an object");
    for (const auto& [k, v] : it->items()) {
      if (!v.is_number_integer() ||
          (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
        return absl::InvalidArgumentError("node capacity: warm holds a non-integer");
      }
      c.warm[k] = v.get<int64_t>();
    }
  }
  return c;
}

}  // namespace sbx::service
