// Port exposure (docs/api.md, "Ports"): /v1/sandboxes/{id}/ports/{port}/<rest> and
// Host: {port}-{id}.{ports.domain} reach a server listening in the sandbox. sbxd opens the
// upstream connection inside the sandbox's network namespace (runtime::Instance::DialPort), so a
// server bound to the sandbox's 127.0.0.1 or ::1 is reached as well as one on 0.0.0.0, whatever
// the egress profile: this is ingress through sbxd, and no egress rule is involved.
//
// Upstream connections are kept alive and reused (api/upstream_pool.h): a request takes an idle
// one of the same sandbox port when there is one, else sbxd dials. The client's connection stays
// keep-alive too, independently. Bodies stream both ways without being held whole: the request body as the server
// reads it (RequestContext::body), the response as the upstream sends it; each piece the upstream
// sends is written at once (Server-Sent Events arrive event by event). A small response of known
// length goes out in one write instead. An Upgrade request (WebSocket) takes the connection over:
// after the request head sbxd relays bytes both ways until either side closes.
#include <sys/socket.h>

#include <cctype>
#include <chrono>
#include <memory>
#include <cstdlib>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/http_relay.h"
#include "api/port_target.h"
#include "api/upstream_pool.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/tls_stream.h"

namespace sbx::api {
namespace {

namespace asio = http::asio;
namespace beast = http::beast;
namespace bhttp = http::bhttp;
using tcp = asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

std::optional<std::string> HeaderValue(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

absl::Status Unreachable(const PortAddress& a, std::string_view why) {
  return ApiError(absl::StatusCode::kUnavailable, "port_unreachable",
                  fmt::format("port {} of sandbox {}: {}", a.port, a.sandbox_id, why));
}


}  // namespace

std::optional<absl::StatusOr<PortAddress>> Api::MatchPort(const http::Request& req) const {
  const std::string_view target(req.target().data(), req.target().size());
  if (!opts_.ports_domain.empty()) {
    auto host = req.find(bhttp::field::host);
    if (host != req.end()) {
      auto m = MatchPortHost(std::string_view(host->value().data(), host->value().size()),
                             target, opts_.ports_domain);
      if (m) return m;
    }
  }
  return MatchPortPath(target);
}

bool Api::IsPortRequest(const http::Request& req) const { return MatchPort(req).has_value(); }

http::asio::awaitable<absl::StatusOr<tcp::socket>> Api::DialUpstream(http::RequestContext& ctx,
                                                                      const PortAddress& a,
                                                                      bool* reused, bool* ipv6) {
  if (reused != nullptr) {
    *reused = false;
    if (auto kept = upstreams_.Take(a.sandbox_id, a.port, UpstreamPool::Clock::now(),
                                    ctx.executor)) {
      *reused = true;
      *ipv6 = kept->ipv6;
      co_return std::move(kept->sock);
    }
  }
  absl::Status last;
  for (bool v6 : {false, true}) {
    *ipv6 = v6;
    auto fd = svc_.DialPort(a.sandbox_id, a.port, v6);
    if (!fd.ok()) {
      last = fd.status();
      if (fd.status().code() == absl::StatusCode::kUnavailable) continue;  // refused at once
      // No IPv6 in the namespace (EADDRNOTAVAIL) is "nothing on ::1".
      if (v6) continue;
      co_return fd.status();
    }
    tcp::socket sock(ctx.executor);
    boost::system::error_code ec;
    sock.assign(v6 ? tcp::v6() : tcp::v4(), fd->Release(), ec);
    if (ec) co_return absl::InternalError(fmt::format("dial port: assign: {}", ec.message()));
    asio::steady_timer deadline(ctx.executor);
    deadline.expires_after(opts_.port_connect_timeout);
    auto r = co_await (sock.async_wait(tcp::socket::wait_write, kTuple) ||
                       deadline.async_wait(kTuple));
    if (r.index() == 1) {
      co_return ApiError(absl::StatusCode::kDeadlineExceeded, "port_timeout",
                         fmt::format("port {} of sandbox {}: connect did not complete within {} ms",
                                     a.port, a.sandbox_id, opts_.port_connect_timeout.count()));
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(sock.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) co_return std::move(sock);
    last = ErrnoStatus(err, "dial port: connect");
  }
  (void)last;
  co_return Unreachable(a, "nothing is listening (connections to 127.0.0.1 and [::1] were "
                           "refused in the sandbox)");
}

void Api::KeepUpstream(const PortAddress& a, tcp::socket& up, bool ipv6) {
  asio::any_io_executor ex = up.get_executor();
  bool needs_watch = false;
  if (!upstreams_.Put(a.sandbox_id, a.port, UpstreamPool::Conn{std::move(up), ipv6},
                      UpstreamPool::Clock::now(), &needs_watch)) {
    return;
  }
  if (needs_watch) {
    // Pause, suspend and delete are jobs: the sandbox's kept connections go when one ends, so
    // none holds its network namespace past its delete.
    auto& waiters = svc_.job_waiters();
    const std::string id = a.sandbox_id;
    const uint64_t handle = waiters.Add(id, [this, id] { upstreams_.Forget(id); });
    if (!upstreams_.Watching(id, handle)) waiters.Remove(handle);
  }
  ArmUpstreamSweep(ex);
}

void Api::ArmUpstreamSweep(asio::any_io_executor ex) {
  {
    std::lock_guard lock(sweep_mu_);
    if (sweep_armed_) return;
    sweep_armed_ = true;
  }
  auto timer = std::make_shared<asio::steady_timer>(ex);
  timer->expires_after(upstreams_.options().max_idle);
  timer->async_wait([this, timer](boost::system::error_code ec) { SweepUpstreams(timer, ec); });
}

void Api::SweepUpstreams(std::shared_ptr<asio::steady_timer> timer, boost::system::error_code ec) {
  std::vector<uint64_t> unwatch;
  {
    std::lock_guard lock(sweep_mu_);
    // Under sweep_mu_: a connection kept while this runs either is seen by this sweep or finds
    // the timer disarmed and arms it.
    auto next = ec ? std::nullopt : upstreams_.Sweep(UpstreamPool::Clock::now(), &unwatch);
    if (!next) {
      sweep_armed_ = false;
    } else {
      timer->expires_at(*next);
      timer->async_wait([this, timer](boost::system::error_code e) { SweepUpstreams(timer, e); });
    }
  }
  for (uint64_t h : unwatch) svc_.job_waiters().Remove(h);
}

namespace {

// RFC 9110 §9.2.2: what a client may send again when a kept connection turned out closed.
bool Idempotent(bhttp::verb v) {
  switch (v) {
    case bhttp::verb::get:
    case bhttp::verb::head:
    case bhttp::verb::options:  // TRACE is idempotent too, but never relayed (405)
    case bhttp::verb::put:
    case bhttp::verb::delete_:
      return true;
    default:
      return false;
  }
}

}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::ProxyPort(
    http::RequestContext& ctx, absl::StatusOr<PortAddress> addr) {
  if (!addr.ok()) co_return Fail(ctx, addr.status());
  const PortAddress& a = *addr;
  const http::Request& req = ctx.req;
  // The methods of HTTP's semantics that a server's application serves, and no others: a
  // TRACE would echo to the client what the relay added (X-Forwarded-For, the headers that
  // reach the server), CONNECT asks for a tunnel to elsewhere, and the rest (WebDAV's, QUERY)
  // are not relayed. Whoever asks and whatever the sandbox's state: the answer names only
  // what the route is.
  switch (req.method()) {
    case bhttp::verb::get:
    case bhttp::verb::head:
    case bhttp::verb::post:
    case bhttp::verb::put:
    case bhttp::verb::patch:
    case bhttp::verb::delete_:
    case bhttp::verb::options:
      break;
    default:
      co_return Fail(ctx, MethodNotAllowed(req, "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"));
  }
  service::SandboxService::PortCredentials creds;
  bool used_authorization = false;
  if (req.find(bhttp::field::authorization) != req.end()) {
    // A management token authenticates to sbxd and stays here; any other Authorization is the
    // application's own (its login), and goes on to it.
    // Only with the sessions scope: a port is a sandbox's data plane, as its sessions are.
    if (auto c = Authenticate(req, std::nullopt, /*allow_attach_token=*/false);
        c.ok() && service::HasScope(c->caller.scopes, service::Scope::kSessions)) {
      creds.caller = std::move(c->caller);
      used_authorization = true;
    }
  }
  creds.traffic_token = HeaderValue(req, kTrafficTokenHeader);
  if (!creds.traffic_token) creds.traffic_token = HeaderValue(req, kE2bTrafficTokenHeader);
  creds.envd_token = HeaderValue(req, "X-Access-Token");
  auto tenant = log::With(ctx.log, [&] { return svc_.AuthorizePort(a.sandbox_id, creds); });
  if (!tenant.ok()) co_return Fail(ctx, tenant.status());
  ctx.log.tenant = *tenant;
  ctx.log.sandbox = a.sandbox_id;

  const bool upgrade = relay::WantsUpgrade(req) && ctx.connection != nullptr;
  UpstreamHeadOptions ho;
  ho.strip_authorization = used_authorization;
  ho.strip_access_token = req.find("E2b-Sandbox-Id") != req.end();
  ho.upgrade = upgrade;
  // The server hands every port request's body over as a stream; only a request that has one
  // (a length, or chunks) sends one on.
  ho.has_body = ctx.body != nullptr && (req.chunked() || req.has_content_length());
  if (ho.has_body && !req.chunked()) {
    auto cl = req.find(bhttp::field::content_length);
    if (cl != req.end()) ho.content_length = std::strtoull(std::string(cl->value()).c_str(), nullptr, 10);
  }
  if (ctx.connection != nullptr) {
    ho.forwarded_for = ctx.peer_address;
    ho.forwarded_proto = ctx.connection->is_tls() ? "https" : "http";
  }
  const std::string head = UpstreamHead(req, a.upstream_target, ho);

  if (upgrade) {
    bool ipv6 = false;
    auto upstream = co_await DialUpstream(ctx, a, nullptr, &ipv6);
    if (!upstream.ok()) co_return Fail(ctx, upstream.status());
    tcp::socket& up = *upstream;
    // The connection is the upstream's from here: its 101 (or refusal) goes to the client as
    // the upstream wrote it.
    auto [ec, n] = co_await asio::async_write(up, asio::buffer(head), kTuple);
    if (ec) co_return Fail(ctx, Unreachable(a, fmt::format("send request: {}", ec.message())));
    co_await relay::Tunnel(ctx, up, opts_.port_idle_timeout);
    co_return std::nullopt;
  }

  // A kept connection the server closed meanwhile fails before any byte of an answer: a
  // request that can be sent again (no body, idempotent) then goes once more on a new one.
  const bool replayable = !ho.has_body && Idempotent(req.method());
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    bool ipv6 = false;
    auto upstream = co_await DialUpstream(ctx, a, &reused, &ipv6);
    if (!upstream.ok()) co_return Fail(ctx, upstream.status());
    auto out = co_await relay::Exchange(ctx, *upstream, head, ho, opts_.port_idle_timeout,
                                        [&a](std::string_view why) { return Unreachable(a, why); });
    if (out.stale && reused && replayable && attempt == 0) continue;
    if (out.reusable) KeepUpstream(a, *upstream, ipv6);
    if (out.whole) co_return std::move(out.whole);
    if (!out.began) co_return Fail(ctx, out.error.ok() ? Unreachable(a, "no answer") : out.error);
    co_return std::nullopt;
  }
}

}  // namespace sbx::api
