#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "daemon/config_internal.h"
#include "daemon/egress_config.h"
#include "runtime/ns/cgroup.h"
#include "store/open_store.h"

namespace sbx::daemon {

using namespace config_internal;

absl::StatusOr<std::pair<std::string, uint16_t>> SplitListen(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError("expected HOST:PORT, e.g. 127.0.0.1:7070");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto port = ParseInt(std::string_view(listen).substr(colon + 1));
  if (!port || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError("bad port (0 to 65535; 0 picks a free one)");
  }
  return std::make_pair(host, static_cast<uint16_t>(*port));
}

absl::Status Validate(const Config& c) {
  std::vector<std::string> errors;
  for (const auto& k : Keys()) {
    if (k.type == Type::kInt) {
      const int64_t v = Num(c, k);
      if (v < k.min || v > k.max) {
        errors.push_back(fmt::format("{}: must be between {} and {} ({})", LabelOf(c, k), k.min,
                                     k.max, k.why));
      }
    }
    if (k.type == Type::kString && *k.choices) {
      std::vector<std::string> choices;
      std::stringstream in(k.choices);
      for (std::string ch; std::getline(in, ch, '|');) choices.push_back(ch);
      if (std::find(choices.begin(), choices.end(), Str(c, k)) == choices.end()) {
        std::string last = choices.back();
        choices.pop_back();
        errors.push_back(
            fmt::format("{}: expected {} or {}", LabelOf(c, k), Join(choices, ", "), last));
      }
    }
  }
  if (c.tls.cert_file.empty() != c.tls.key_file.empty()) {
    const KeyInfo& set = *FindKey(c.tls.cert_file.empty() ? "tls.key_file" : "tls.cert_file");
    const char* unset = c.tls.cert_file.empty() ? "tls.cert_file" : "tls.key_file";
    errors.push_back(fmt::format("{}: {} must be set too (TLS needs both files, or neither)",
                                 LabelOf(c, set), unset));
  }
  if (auto l = SplitListen(c.server.listen); !l.ok()) {
    errors.push_back(fmt::format("{}: {}", LabelOf(c, *FindKey("server.listen")),
                                 std::string(l.status().message())));
  }
  if (auto st = sbx::runtime::ns::ValidateCgroupParent(c.runtime.ns.cgroup_parent); !st.ok()) {
    errors.push_back(fmt::format("{}: {}", LabelOf(c, *FindKey("runtime.ns.cgroup_parent")),
                                 std::string(st.message())));
  }
  if (const std::string& d = c.ports.domain;
      !d.empty() && (d.size() > 200 || d.front() == '.' || d.back() == '.' ||
                     !std::all_of(d.begin(), d.end(), [](unsigned char ch) {
                       return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                              ch == '.';
                     }))) {
    errors.push_back(fmt::format("{}: '{}' is not a lowercase DNS name (letters, digits, '-', "
                                 "'.'; empty turns host-name routing off)",
                                 LabelOf(c, *FindKey("ports.domain")), d));
  }
  if (const std::string& d = c.e2b.domain;
      !d.empty() && (d.size() > 206 || d.front() == '.' ||
                     !std::all_of(d.begin(), d.end(), [](unsigned char ch) {
                       return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                              ch == '.' || ch == ':';
                     }))) {
    errors.push_back(fmt::format("{}: '{}' is not a lowercase DNS name with an optional :PORT",
                                 LabelOf(c, *FindKey("e2b.domain")), d));
  }
  if (c.state.dir.empty()) {
    errors.push_back(fmt::format("{}: must not be empty", LabelOf(c, *FindKey("state.dir"))));
  }
  if (absl::Status st = store::ValidateStoreUrl(c.store.url); !st.ok()) {
    errors.push_back(fmt::format("{}: {}", LabelOf(c, *FindKey("store.url")),
                                 std::string(st.message())));
  }
  if (c.node.role != "all" && c.store.url.rfind("postgres", 0) != 0) {
    errors.push_back(fmt::format(
        "{} needs a store every process shares: set {} to a postgresql:// URL (docs/scale.md)",
        LabelOf(c, *FindKey("node.role")), LabelOf(c, *FindKey("store.url"))));
  }
  if (c.node.lost_after_ms < 3 * c.node.heartbeat_ms) {
    errors.push_back(fmt::format("{} must be at least 3 x {}: one late heartbeat must not lose a "
                                 "node",
                                 LabelOf(c, *FindKey("node.lost_after_ms")),
                                 LabelOf(c, *FindKey("node.heartbeat_ms"))));
  }
  if (!c.node.url.empty() && c.node.url.rfind("http://", 0) != 0) {
    errors.push_back(fmt::format("{}: '{}' must be an http:// URL (api replicas reach nodes in "
                                 "plain HTTP on the cluster network)",
                                 LabelOf(c, *FindKey("node.url")), c.node.url));
  }
  if (c.node.name.size() > 253 ||
      !std::all_of(c.node.name.begin(), c.node.name.end(), [](unsigned char ch) {
        return std::isalnum(ch) || ch == '-' || ch == '.' || ch == '_';
      })) {
    errors.push_back(fmt::format("{}: '{}' is not a node name (letters, digits, '-', '.', '_')",
                                 LabelOf(c, *FindKey("node.name")), c.node.name));
  }
  for (const auto& [name, n] : c.warm_pool) {
    const bool name_ok = !name.empty() && name.size() <= 255 &&
                         std::none_of(name.begin(), name.end(), [](unsigned char ch) {
                           return ch <= ' ' || ch == '=' || ch == 0x7f;
                         });
    if (!name_ok) {
      errors.push_back(fmt::format("{}: '{}' is not a template name", WarmLabel(c, name), name));
    }
    if (n < 0 || n > kMaxWarmPool) {
      errors.push_back(fmt::format("{}: must be between 0 and {} (sandboxes kept ready per "
                                   "template)",
                                   WarmLabel(c, name), kMaxWarmPool));
    }
  }
  if (auto e = EgressFromConfig(c); !e.ok()) errors.push_back(std::string(e.status().message()));
  // Relations: a default outside the limits would give sandboxes what no create may ask for.
  auto key = [&](const char* path) { return LabelOf(c, *FindKey(path)); };
  if (c.server.max_connections > 0 &&
      c.server.max_connections_per_ip > c.server.max_connections) {
    errors.push_back(fmt::format("{} is above {}", key("server.max_connections_per_ip"),
                                 key("server.max_connections")));
  }
  const auto& d = c.sandbox.defaults;
  const auto& l = c.sandbox.limits;
  // Memory and disk have a floor and a ceiling; vcpu's floor is fixed (resources.h).
  const struct {
    const char* name;
    int64_t value, min, max;
  } ranged[] = {{"memory_mib", d.memory_mib, l.min_memory_mib, l.max_memory_mib},
                {"disk_mib", d.disk_mib, l.min_disk_mib, l.max_disk_mib}};
  for (const auto& r : ranged) {
    const std::string def = fmt::format("sandbox.defaults.{}", r.name);
    const std::string lo = fmt::format("sandbox.limits.min_{}", r.name);
    const std::string hi = fmt::format("sandbox.limits.max_{}", r.name);
    if (r.min > r.max) {
      errors.push_back(fmt::format("{} is above {}", key(lo.c_str()), key(hi.c_str())));
    } else if (r.value < r.min || r.value > r.max) {
      errors.push_back(fmt::format("{}: must be within {} and {}", key(def.c_str()),
                                   key(lo.c_str()), key(hi.c_str())));
    }
  }
  if (d.vcpu > l.max_vcpu) {
    errors.push_back(fmt::format("{}: must not be above {}", key("sandbox.defaults.vcpu"),
                                 key("sandbox.limits.max_vcpu")));
  }
  return Errors(errors);
}

absl::StatusOr<ConnectionLimits> ResolveConnectionLimits(const Config& c,
                                                         uint64_t open_files) {
  const auto& s = c.server;
  auto key = [&](const char* path) { return LabelOf(c, *FindKey(path)); };
  ConnectionLimits out;
  out.reserved_connections = static_cast<size_t>(s.reserved_connections);
  const uint64_t budget = open_files / 2;
  if (s.max_connections > 0) {
    out.max_connections = static_cast<size_t>(s.max_connections);
    if (out.max_connections + out.reserved_connections > budget) {
      return absl::InvalidArgumentError(fmt::format(
          "{} with {}: needs {} of sbxd's RLIMIT_NOFILE of {}, more than half of it (each "
          "connection may hold an agent socket too, and sandboxes need the rest): lower it or "
          "raise the limit (LimitNOFILE= in the systemd unit)",
          key("server.max_connections"), key("server.reserved_connections"),
          out.max_connections + out.reserved_connections, open_files));
    }
  } else {
    const uint64_t quarter = open_files / 4;
    uint64_t derived = std::min<uint64_t>(4096, quarter);
    if (derived + out.reserved_connections > budget) {
      derived = budget > out.reserved_connections ? budget - out.reserved_connections : 0;
    }
    if (derived == 0) {
      return absl::InvalidArgumentError(fmt::format(
          "sbxd's RLIMIT_NOFILE of {} leaves no room for API connections beside {}: raise "
          "the limit (LimitNOFILE= in the systemd unit)",
          open_files, key("server.reserved_connections")));
    }
    out.max_connections = static_cast<size_t>(derived);
  }
  if (s.max_connections_per_ip > 0) {
    out.max_connections_per_ip = static_cast<size_t>(s.max_connections_per_ip);
    if (out.max_connections_per_ip > out.max_connections) {
      return absl::InvalidArgumentError(
          fmt::format("{} is above the {} API connections of {} (derived from RLIMIT_NOFILE {})",
                      key("server.max_connections_per_ip"), out.max_connections,
                      key("server.max_connections"), open_files));
    }
  } else if (c.node.role == "node") {
    // A node's every client is an api replica, each arriving from one address: a quarter would
    // let two replicas starve the others' forwarded requests.
    out.max_connections_per_ip = out.max_connections;
  } else {
    out.max_connections_per_ip = std::max<size_t>(1, out.max_connections / 4);
  }
  return out;
}

}  // namespace sbx::daemon
