// ConnProxy: sbxd's transparent TCP proxy that holds domain rules on each connection.
//
// For a sandbox with domain rules, nftables redirects every TCP connection to an address
// sbxd's resolver answered it (set resolved4/6, veth . address) to this proxy's port
// (nft_ruleset.h, ProxyRedirectRules). Per connection, on one thread of its own:
//   1. the sandbox, by the connection's source address (a pool address: the egress chain's
//      source validation does not see redirected packets, but the veth's own addresses are the
//      only ones its neighbour answers, and the input chain drops spoofed sources before they
//      reach a local socket); unknown source: reset.
//   2. the original destination (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST); refused again when it
//      is an always-blocked, pool, operator-denied or host address (defence in depth: the
//      resolver strips such answers, but the proxy connects from the host, past the forward
//      chain).
//   3. conn_proxy_judge.h: CIDR rules first; otherwise the name, PEEKED (MSG_PEEK: the bytes
//      stay in the socket and TLS is never terminated), up to kPeekLimit bytes and
//      kPeekTimeout; SO_RCVLOWAT makes epoll wait for the next byte instead of spinning while
//      a ClientHello arrives in pieces. A refusal is a DenialLog entry and a reset.
//   4. an allowed connection is connected from the host to the original destination (non-
//      blocking) and relayed both ways with splice(2) through a pipe per direction (no copy to
//      user space), half-close aware (a FIN is passed on as shutdown(SHUT_WR)), closed after
//      the idle timeout.
// A registry of live connections per sandbox lets a PATCH cut those its new rules forbid
// (CutDisallowed) and a delete close them all (CloseAll).
//
// Thread safety: Start/Stop from one thread; CutDisallowed, CloseAll, Connections and Count
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/conn_proxy_judge.h"
#include "net/ip_prefix.h"

namespace sbx::net {

// The bounded wait for a connection's first bytes (a client that sends nothing is a server-
// speaks-first protocol, which domain rules cannot name: refused as `no_name`).
inline constexpr std::chrono::seconds kPeekTimeout{5};
// Live proxied connections per sandbox and in all (each costs two sockets and two pipes).
inline constexpr size_t kProxyMaxPerSandbox = 1024;
inline constexpr size_t kProxyMaxTotal = 16384;

// What the proxy asks of sbxd's network (NetworkHost in the daemon; fakes in tests).
struct ProxyHooks {
  // The sandbox a source address belongs to.
  std::function<std::optional<std::string>(const IpPrefix& source)> id_of_address;
  // Its effective rules; unset: the sandbox is gone.
  std::function<std::optional<EffectiveRules>(const std::string& id)> rules_of;
  // Whether sbxd's resolver answered `addr` for `name` to this sandbox.
  std::function<bool(const std::string& id, const std::string& name, const IpPrefix& addr)> resolved;
  // A reason when the host must never connect there (always blocked, pool, operator deny,
  // the host itself).
  std::function<std::optional<std::string>(const IpPrefix& dest)> forbidden;
  // A refused connection: the DenialLog (reason, dest, name, port).
  std::function<void(const std::string& id, const std::string& reason, const IpPrefix& dest,
                     const std::string& name, uint16_t port)>
      deny;
  // The connection's destination before the redirect; unset: SO_ORIGINAL_DST (tests replace it).
  std::function<absl::StatusOr<std::pair<IpPrefix, uint16_t>>(int fd)> original_dst;
};

struct ProxyOptions {
  uint16_t port = 0;               // 0: any (tests read it back with port())
  bool loopback_only = false;      // tests: listen on 127.0.0.1 and ::1 only
  std::chrono::seconds idle_timeout{600};
  size_t pipe_bytes = 256 * 1024;  // each direction's pipe (F_SETPIPE_SZ)
};

struct ProxiedConnection {
  std::string id, name;  // name empty: allowed by a CIDR rule
  IpPrefix dest;
  uint16_t port = 0;
};

class ConnProxy {
 public:
  static absl::StatusOr<std::unique_ptr<ConnProxy>> Start(ProxyOptions opts, ProxyHooks hooks);
  ~ConnProxy();  // Stop()
  ConnProxy(const ConnProxy&) = delete;
  ConnProxy& operator=(const ConnProxy&) = delete;

  uint16_t port() const { return port_; }
  // Closes every connection and joins the thread. Idempotent.
  void Stop();

  // Resets sandbox `id`'s relayed connections that `rules` no longer allow; returns how many.
  size_t CutDisallowed(const std::string& id, const EffectiveRules& rules);
  // Resets all of sandbox `id`'s connections (delete).
  size_t CloseAll(const std::string& id);
  std::vector<ProxiedConnection> Connections(const std::string& id);
  size_t Count();

  struct Impl;

 private:
  ConnProxy() = default;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
  std::thread thread_;
};

// SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST of an accepted socket of family `family`.
absl::StatusOr<std::pair<IpPrefix, uint16_t>> OriginalDestination(int fd, int family);

}  // namespace sbx::net
