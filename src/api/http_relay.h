// One HTTP exchange relayed to an upstream server over a connection the caller dialled: the
// request head (built by UpstreamHead) and its body as it arrives, then the response as the
// upstream sends it, each piece written at once (Server-Sent Events arrive event by event; a
// small response of known length goes out in one write). Or, for an Upgrade (WebSocket), the
// connection taken over: bytes both ways until either side closes.
//
// Two proxies use it: port exposure (port_routes.cc: a server in a sandbox) and the api tier of
// a cluster (cluster_router.cc: the node that holds a sandbox). Neither holds a body whole.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "api/port_target.h"
#include "http/server.h"

namespace sbx::api::relay {

struct ExchangeResult {
  std::optional<http::Response> whole;  // a response sent in one piece
  bool began = false;                   // else: streamed to the client (began), or failed
  absl::Status error;
  bool stale = false;     // the upstream closed before any byte of an answer
  bool reusable = false;  // a clean exchange with a keep-alive answer: `up` may be kept
};

// The error for a failure of the upstream ("no answer (...)", "response broke off (...)").
using Unreachable = std::function<absl::Status(std::string_view why)>;

// One request and its response over `up`. The request body is ctx.body (streamed) when
// `ho.has_body`, else none. Ends the exchange once nothing has moved for `idle`.
http::asio::awaitable<ExchangeResult> Exchange(http::RequestContext& ctx,
                                               http::asio::ip::tcp::socket& up,
                                               const std::string& head,
                                               const UpstreamHeadOptions& ho,
                                               std::chrono::seconds idle,
                                               const Unreachable& unreachable);

// After the Upgrade request's head went to `up`: the connection is the upstream's from here
// (its 101, or refusal, goes to the client as the upstream wrote it), relayed both ways until
// either side closes or nothing moves for `idle`. The caller returns nullopt after it.
http::asio::awaitable<void> Tunnel(http::RequestContext& ctx, http::asio::ip::tcp::socket& up,
                                   std::chrono::seconds idle);

// Upgrade: X with a Connection header naming "upgrade" (RFC 9110 §7.8), in any case.
bool WantsUpgrade(const http::Request& req);

}  // namespace sbx::api::relay
