// Port exposure's addressing (docs/api.md, "Ports"): which sandbox port a request is for, and
// the request head sbxd sends to the server in the sandbox. Pure functions of untrusted input
// (the request target and its Host header): never throw, fuzzed (tests/fuzz/port_target_fuzz.cc).
//
// Two forms reach the same proxy (port_routes.cc):
//   path:      /v1/sandboxes/{id}/ports/{port}/<rest>  -> the upstream sees /<rest> and the query
//   host name: Host: {port}-{id}.{domain}              -> the upstream sees the target as it is
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "http/server.h"

namespace sbx::api {

struct PortAddress {
  std::string sandbox_id;  // as given: the service checks it
  uint16_t port = 0;
  std::string upstream_target;  // "/" at least; never contains CR, LF or spaces
  bool by_host = false;
};

// nullopt: not a port request (the route table answers it). An error: a port request with a bad
// port (400 naming the field "port").
std::optional<absl::StatusOr<PortAddress>> MatchPortPath(std::string_view target);
// `domain` empty: host-name routing is off. The Host header may carry a :port, and any case.
// The id may be written with `-` for its `_` (`8080-sbx-abc…`): `_` is no host-name character,
// and TLS clients match no wildcard certificate (`*.domain`) to a label holding one.
std::optional<absl::StatusOr<PortAddress>> MatchPortHost(std::string_view host,
                                                        std::string_view target,
                                                        std::string_view domain);
// 1..65535, decimal, no sign or leading zeros.
absl::StatusOr<uint16_t> ParsePortNumber(std::string_view text);

// What the upstream must not see or cannot use: sbxd's credentials (the traffic token headers
// always; Authorization when it authenticated to sbxd), hop-by-hop headers (RFC 9110 §7.6.1)
// and the body framing, which UpstreamHead writes itself.
struct UpstreamHeadOptions {
  bool strip_authorization = false;
  // A request of the E2B gateway (e2b/e2b.h): its X-Access-Token is the sandbox's envd token,
  // sbxd's credential, not the application's.
  bool strip_access_token = false;
  // Forwarding to a node of the cluster (cluster_router.h), which authenticates: the traffic
  // token headers go on too.
  bool keep_credentials = false;
  // Non-empty: sent as X-Request-Id instead of the client's (the node then answers with the
  // replica's id, so the error body and the header agree).
  std::string request_id;
  bool upgrade = false;        // keep Connection: Upgrade and Upgrade (else keep-alive)
  bool has_body = false;
  std::optional<uint64_t> content_length;  // with has_body: else chunked
  std::string forwarded_for;  // the client's address, "" if unknown
  // The client's scheme ("http", "https": sbxd's listener ended TLS), "" if unknown. The
  // server behind sbxd sees plain HTTP either way, and would otherwise build http:// links
  // and redirects for a client that came over https.
  std::string forwarded_proto;
};
std::string UpstreamHead(const http::Request& req, const std::string& target,
                         const UpstreamHeadOptions& o);
// Whether a response header of the upstream is passed on to the client (not hop-by-hop, not
// the framing, which sbxd's server sets).
bool PassResponseHeader(std::string_view name);

inline constexpr std::string_view kTrafficTokenHeader = "X-Sbx-Traffic-Token";
inline constexpr std::string_view kE2bTrafficTokenHeader = "e2b-traffic-access-token";

}  // namespace sbx::api
