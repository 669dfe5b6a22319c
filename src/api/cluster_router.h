// The api tier of a cluster (`sbxd --role api`, docs/scale.md): a stateless front for the
// nodes. It authenticates nothing and holds no sandbox; each request goes whole, byte for byte,
// to one node, which authenticates, authorizes and answers it from the shared store:
//   - a create (POST /v1/sandboxes, E2B's POST /sandboxes): the node placement picks;
//   - anything about a sandbox, a session or an operation (its path, the port host name
//     {port}-{id}.{domain}, E2B's E2b-Sandbox-Id header): the node that holds it, or any live
//     node when that one is lost (the store then answers: a lost sandbox, a failed operation);
//   - the rest (lists, templates, tenants): any live node, in turn.
// Bodies stream both ways (http_relay.h), so attach, WebSocket, uploads and port traffic pass
// through as they would on one host. /healthz, /readyz and /metrics are the replica's own.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "api/upstream_pool.h"
#include "common/metrics.h"
#include "http/server.h"
#include "service/cluster.h"

namespace sbx::api {

struct ClusterRouterOptions {
  // Host-name routing of sandbox ports (config ports.domain); empty: off.
  std::string ports_domain;
  std::chrono::milliseconds connect_timeout{5000};
  // A forwarded exchange with no byte moving either way for this long is ended.
  std::chrono::seconds idle_timeout{600};
  metrics::Registry* metrics = nullptr;  // nullptr: metrics::Default()
  // The tenant a request's credentials name, asked only for a create with anti-affinity (whose
  // group is the tenant's). Null, or an error: placed without it; the node then answers for
  // the credentials.
  std::function<absl::StatusOr<std::string>(const http::Request&)> tenant_of;
};

// Where a request goes (Classify).
struct RouteKey {
  enum class Kind { kLocal, kCreate, kSandbox, kSession, kOperation, kAny };
  Kind kind = Kind::kAny;
  std::string id;  // kSandbox, kSession, kOperation: as sbx writes it ("sbx_…")
};
RouteKey Classify(const http::Request& req, std::string_view ports_domain);

// What placement reads of a create's body (sbx's or E2B's); nullopt when it is not JSON this
// replica understands: the node then answers the 400.
std::optional<service::PlacementRequest> PlacementOf(const http::Request& req, bool e2b);

class ClusterRouter {
 public:
  ClusterRouter(service::Cluster& cluster, ClusterRouterOptions opts);
  http::asio::awaitable<std::optional<http::Response>> Handle(http::RequestContext& ctx);
  // http::ServerOptions::stream_body: every body streams but a create's, which placement reads
  // (JSON of a few KiB, bounded by the server's body limit).
  static bool StreamsBody(const http::Request& req);

 private:
  // `any`: the request may go to any live node, so a node that refuses the connection is
  // replaced by the next one (nothing was sent to it yet).
  // *served_by: the node that answered.
  http::asio::awaitable<std::optional<http::Response>> Forward(
      http::RequestContext& ctx, service::Cluster::Target to, bool any, std::string* served_by);
  // *any: the request may go to any live node (it names none, or its node is not alive).
  absl::StatusOr<service::Cluster::Target> TargetOf(const RouteKey& key,
                                                    const http::Request& req, bool* any);

  // Remembers where what a create or a new session made lives (its node, from the answer).
  void RememberMade(const std::string& body, const std::string& served_by);
  // A kept connection to the node when one is idle (*reused then true), else a new one.
  // *ipv6: whether it is an IPv6 connection (what keeping it needs to know).
  http::asio::awaitable<absl::StatusOr<http::asio::ip::tcp::socket>> Connect(
      http::RequestContext& ctx, const service::Cluster::Target& to, bool* reused, bool* ipv6);

  service::Cluster& cluster_;
  const ClusterRouterOptions opts_;
  // Idle keep-alive connections per node (keyed by URL, port 0): a forwarded request costs no
  // connect and no accept on the node when one is free.
  UpstreamPool kept_;
  metrics::Registry& registry_;
  metrics::Family<metrics::Counter>& forwarded_;  // {node, outcome}
};

}  // namespace sbx::api
