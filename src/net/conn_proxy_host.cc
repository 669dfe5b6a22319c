#include "net/conn_proxy_host.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "net/denial_log.h"
#include "net/name_table.h"

namespace sbx::net {
namespace {

// The host's own addresses, read again at most every two seconds (an address added since
// is refused by the post-connect check in conn_proxy.cc: a local route's source is the
// destination itself).
bool IsHostAddress(const IpPrefix& dest) {
  static std::mutex mu;
  static std::vector<IpPrefix> addrs;
  static std::chrono::steady_clock::time_point read_at;
  std::lock_guard<std::mutex> lock(mu);
  auto now = std::chrono::steady_clock::now();
  if (addrs.empty() || now - read_at > std::chrono::seconds(2)) {
    ifaddrs* ifa = nullptr;
    if (getifaddrs(&ifa) == 0) {
      addrs.clear();
      for (ifaddrs* i = ifa; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr) continue;
        if (i->ifa_addr->sa_family == AF_INET) {
          const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
          addrs.push_back(IpPrefix::Host(AF_INET, reinterpret_cast<const uint8_t*>(&in->sin_addr)));
        } else if (i->ifa_addr->sa_family == AF_INET6) {
          const auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
          addrs.push_back(IpPrefix::Host(AF_INET6, in6->sin6_addr.s6_addr));
        }
      }
      freeifaddrs(ifa);
      read_at = now;
    }
  }
  for (const auto& a : addrs) {
    if (a == dest) return true;
  }
  return false;
}

}  // namespace

std::optional<std::string> ForbiddenDestination(const NetPolicyConfig& cfg, const IpPrefix& dest) {
  for (const IpPrefix* pool : {&cfg.pool4, &cfg.pool6}) {
    if (pool->family == dest.family && pool->Contains(dest)) return std::string(kReasonSandbox);
  }
  for (const auto& b : AlwaysBlocked()) {
    if (b.range.family != dest.family || !b.range.Contains(dest)) continue;
    bool exempt = false;
    for (const auto& e : cfg.exempt) {
      exempt = exempt || (e.family == dest.family && e.Contains(dest));
    }
    if (b.reason == "metadata" || !exempt) return b.reason;
  }
  for (const auto& d : cfg.operator_deny) {
    if (d.family == dest.family && d.Contains(dest)) return std::string(kReasonDenyRule);
  }
  if (IsHostAddress(dest)) return std::string(kReasonHost);
  return std::nullopt;
}

ProxyHooks ProxyHooksFor(NetworkHost* host) {
  ProxyHooks h;
  h.id_of_address = [host](const IpPrefix& src) { return host->IdOfAddress(src); };
  h.rules_of = [host](const std::string& id) { return host->RulesOf(id); };
  h.resolved = [host](const std::string& id, const std::string& name, const IpPrefix& addr) {
    return host->names().Resolved(id, name, addr);
  };
  h.forbidden = [host](const IpPrefix& dest) { return ForbiddenDestination(host->config(), dest); };
  h.deny = [host](const std::string& id, const std::string& reason, const IpPrefix& dest,
                  const std::string& name, uint16_t port) {
    Denial d;
    d.time = absl::Now();
    d.reason = reason;
    d.dest = dest.AddressString();
    d.name = name;
    d.protocol = "tcp";
    d.port = port;
    host->denials_log().Record(id, d);
  };
  return h;
}

}  // namespace sbx::net
