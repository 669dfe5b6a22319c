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
constexpr size_t kPiece = 64 << 10;
// A response of known length up to this is read whole and sent in one write.
constexpr uint64_t kWholeBelow = 256 << 10;
constexpr uint32_t kMaxUpstreamHeader = 64 << 10;

std::optional<std::string> HeaderValue(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

// Upgrade: X with a Connection header naming "upgrade" (RFC 9110 §7.8), in any case.
bool WantsUpgrade(const http::Request& req) {
  if (req.find(bhttp::field::upgrade) == req.end()) return false;
  std::string conn(req[bhttp::field::connection]);
  for (char& c : conn) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return conn.find("upgrade") != std::string::npos;
}

absl::Status Unreachable(const PortAddress& a, std::string_view why) {
  return ApiError(absl::StatusCode::kUnavailable, "port_unreachable",
                  fmt::format("port {} of sandbox {}: {}", a.port, a.sandbox_id, why));
}

// Bytes one way until the source ends or either side fails; then the end is passed on
// (shutdown of the sending side), so a half-closed WebSocket or TCP stream stays half-closed.
// Ends a relay once nothing has moved for `idle`: closing the sockets fails their pending reads
// and writes, so the relay's own error paths end it (never a cancelled write half-way into the
// client's stream). Without it a server in the sandbox that never answers, or a WebSocket both
// ends abandoned, would hold the descriptors, and the sandbox's network namespace they keep
// alive, for ever. `Run` returns when `relay` has returned.
class IdleWatch {
 public:
  IdleWatch(asio::any_io_executor ex, std::chrono::seconds idle) : timer_(ex), idle_(idle) {}
  void Touch() { last_ = std::chrono::steady_clock::now(); }

  asio::awaitable<void> Run(asio::awaitable<void> relay, tcp::socket& a, tcp::socket* b) {
    co_await (Finish(std::move(relay)) && Watch(a, b));
  }

 private:
  asio::awaitable<void> Finish(asio::awaitable<void> relay) {
    co_await std::move(relay);
    done_ = true;
    timer_.cancel();
  }
  asio::awaitable<void> Watch(tcp::socket& a, tcp::socket* b) {
    while (!done_) {
      const auto due = last_ + idle_;
      if (std::chrono::steady_clock::now() >= due) {
        boost::system::error_code ignored;
        a.close(ignored);
        if (b != nullptr) b->close(ignored);
        co_return;
      }
      timer_.expires_at(due);
      co_await timer_.async_wait(kTuple);  // cancelled once the relay is done
    }
  }

  asio::steady_timer timer_;
  std::chrono::seconds idle_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  bool done_ = false;  // one strand: no lock
};

// Shuts the sending side of the connection down, passing on the end of the other side.
void ShutdownSend(tcp::socket& s) {
  boost::system::error_code ignored;
  s.shutdown(tcp::socket::shutdown_send, ignored);
}
// Over TLS the TCP connection is half-closed without close_notify: sending that would take an
// SSL_shutdown, which must not run while the other direction reads the same TLS stream. The
// client sees the relayed stream end as a truncated TLS stream.
void ShutdownSend(MaybeTlsStream& s) { ShutdownSend(s.tcp().socket()); }

template <class From, class To>
asio::awaitable<void> Pump(From& from, To& to, IdleWatch& act) {
  std::unique_ptr<char[]> buf(new char[kPiece]);  // not zeroed: every byte is read into first
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buf.get(), kPiece), kTuple);
    if (ec) break;
    act.Touch();
    auto [wec, wn] = co_await asio::async_write(to, asio::buffer(buf.get(), n), kTuple);
    if (wec) break;
  }
  ShutdownSend(to);
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
                                                                      bool* reused) {
  if (reused != nullptr) {
    *reused = false;
    if (auto kept = upstreams_.Take(a.sandbox_id, a.port, UpstreamPool::Clock::now())) {
      tcp::socket sock(ctx.executor);
      boost::system::error_code ec;
      sock.assign(kept->ipv6 ? tcp::v6() : tcp::v4(), kept->fd.Release(), ec);
      if (!ec) {
        *reused = true;
        co_return std::move(sock);
      }
    }
  }
  absl::Status last;
  for (bool ipv6 : {false, true}) {
    auto fd = svc_.DialPort(a.sandbox_id, a.port, ipv6);
    if (!fd.ok()) {
      last = fd.status();
      if (fd.status().code() == absl::StatusCode::kUnavailable) continue;  // refused at once
      // No IPv6 in the namespace (EADDRNOTAVAIL) is "nothing on ::1".
      if (ipv6) continue;
      co_return fd.status();
    }
    tcp::socket sock(ctx.executor);
    boost::system::error_code ec;
    sock.assign(ipv6 ? tcp::v6() : tcp::v4(), fd->Release(), ec);
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

void Api::KeepUpstream(const PortAddress& a, tcp::socket& up) {
  boost::system::error_code ec;
  const bool ipv6 = up.local_endpoint(ec).address().is_v6();
  if (ec) return;
  asio::any_io_executor ex = up.get_executor();
  UniqueFd fd(up.release(ec));
  if (ec || !fd) return;
  bool needs_watch = false;
  if (!upstreams_.Put(a.sandbox_id, a.port, UpstreamPool::Conn{std::move(fd), ipv6},
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
    case bhttp::verb::options:
    case bhttp::verb::trace:
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

  const bool upgrade = WantsUpgrade(req) && ctx.connection != nullptr;
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
    boost::system::error_code ec;
    auto ep = ctx.connection->tcp().socket().remote_endpoint(ec);
    if (!ec) ho.forwarded_for = ep.address().to_string();
    ho.forwarded_proto = ctx.connection->is_tls() ? "https" : "http";
  }
  const std::string head = UpstreamHead(req, a.upstream_target, ho);

  if (upgrade) {
    auto upstream = co_await DialUpstream(ctx, a, nullptr);
    if (!upstream.ok()) co_return Fail(ctx, upstream.status());
    tcp::socket& up = *upstream;
    // The connection is the upstream's from here: its 101 (or refusal) goes to the client as
    // the upstream wrote it.
    auto [ec, n] = co_await asio::async_write(up, asio::buffer(head), kTuple);
    if (ec) co_return Fail(ctx, Unreachable(a, fmt::format("send request: {}", ec.message())));
    ctx.taken_status = 101;
    ctx.connection->tcp().expires_never();
    // Plain or TLS alike: the client's side is the connection's stream, whose TLS (if any)
    // sbxd ends; the upstream is plain TCP in the sandbox.
    MaybeTlsStream& client = *ctx.connection;
    IdleWatch act(up.get_executor(), opts_.port_idle_timeout);
    auto both_ways = Pump(client, up, act) && Pump(up, client, act);
    co_await act.Run(std::move(both_ways), up, &client.tcp().socket());
    co_return std::nullopt;
  }

  // A kept connection the server closed meanwhile fails before any byte of an answer: a
  // request that can be sent again (no body, idempotent) then goes once more on a new one.
  const bool replayable = !ho.has_body && Idempotent(req.method());
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    auto upstream = co_await DialUpstream(ctx, a, &reused);
    if (!upstream.ok()) co_return Fail(ctx, upstream.status());
    auto out = co_await Exchange(ctx, a, *upstream, head, ho);
    if (out.stale && reused && replayable && attempt == 0) continue;
    if (out.reusable) KeepUpstream(a, *upstream);
    if (out.whole) co_return std::move(out.whole);
    if (!out.began) co_return Fail(ctx, out.error.ok() ? Unreachable(a, "no answer") : out.error);
    co_return std::nullopt;
  }
}

http::asio::awaitable<Api::PortExchange> Api::Exchange(http::RequestContext& ctx,
                                                       const PortAddress& a, tcp::socket& up,
                                                       const std::string& head,
                                                       const UpstreamHeadOptions& ho) {
  const http::Request& req = ctx.req;
  PortExchange out;
  // Request: the head, then the body as it arrives.
  IdleWatch act(up.get_executor(), opts_.port_idle_timeout);
  bool upload_failed = false;
  bool upload_done = false;  // all of the request went out
  absl::Status upload_error;
  auto upload = [&]() -> asio::awaitable<void> {
    auto [ec, n] = co_await asio::async_write(up, asio::buffer(head), kTuple);
    if (ec) {
      upload_failed = true;
      co_return;
    }
    if (!ho.has_body) {
      upload_done = true;
      co_return;
    }
    std::unique_ptr<char[]> buf(new char[kPiece]);  // not zeroed: every byte is read into first
    std::vector<asio::const_buffer> bufs;
    const bool chunked = !ho.content_length;
    for (;;) {
      auto got = co_await ctx.body->ReadSome(buf.get(), kPiece);
      act.Touch();
      if (!got.ok()) {
        upload_error = got.status();
        upload_failed = true;
        boost::system::error_code ignored;
        up.shutdown(tcp::socket::shutdown_both, ignored);  // ends the response side as well
        co_return;
      }
      std::string frame;
      if (*got == 0) {
        if (chunked) {
          frame = "0\r\n\r\n";
          auto [wec, wn] = co_await asio::async_write(up, asio::buffer(frame), kTuple);
          if (wec) co_return;
        }
        upload_done = true;
        co_return;
      }
      bufs.clear();
      if (chunked) {
        frame = fmt::format("{:x}\r\n", *got);
        bufs.push_back(asio::buffer(frame));
      }
      bufs.push_back(asio::buffer(buf.get(), *got));
      if (chunked) bufs.push_back(asio::buffer("\r\n", 2));
      auto [wec, wn] = co_await asio::async_write(up, bufs, kTuple);
      if (wec) {
        // The upstream stopped reading (it answered early, or closed): its answer still counts.
        co_return;
      }
    }
  };

  // Response: the head, then the body piece by piece.
  bool answered = false;  // the whole response was read
  bool keep_alive = false;
  auto relay = [&]() -> asio::awaitable<void> {
    beast::flat_buffer ubuf;
    bhttp::response_parser<bhttp::buffer_body> p;
    p.header_limit(kMaxUpstreamHeader);
    p.body_limit(boost::none);
    if (req.method() == bhttp::verb::head) p.skip(true);
    {
      auto [ec, n] = co_await bhttp::async_read_header(up, ubuf, p, kTuple);
      if (ec) {
        // Nothing at all came back: on a kept connection, the server had closed it.
        // Beast says end_of_stream for a stream that ended before any byte of the head (the
        // race with a server closing the kept connection just as it is reused: rare over
        // loopback TCP, common when the close travels through a microVM's bridge).
        out.stale = ubuf.size() == 0 && !p.got_some() &&
                    (ec == asio::error::eof || ec == bhttp::error::end_of_stream ||
                     ec == asio::error::connection_reset || ec == asio::error::broken_pipe);
        out.error = upload_failed && !upload_error.ok()
                        ? upload_error
                        : Unreachable(a, fmt::format("no answer ({})", ec.message()));
        co_return;
      }
    }
    const auto& uh = p.get();
    // A 1xx is not the answer, and what follows it is not relayed as one: not kept.
    keep_alive = p.keep_alive() && uh.result_int() >= 200;
    std::unique_ptr<char[]> buf(new char[kPiece]);  // not zeroed: every byte is read into first
    auto next_piece = [&]() -> asio::awaitable<absl::StatusOr<size_t>> {
      p.get().body().data = buf.get();
      p.get().body().size = kPiece;
      auto [ec, n] = co_await bhttp::async_read_some(up, ubuf, p, kTuple);
      act.Touch();
      if (ec && ec != bhttp::error::need_buffer) {
        co_return Unreachable(a, fmt::format("response broke off ({})", ec.message()));
      }
      co_return kPiece - p.get().body().size;
    };
    auto copy_fields = [&](auto& dst) {
      for (const auto& f : uh) {
        const std::string_view name(f.name_string().data(), f.name_string().size());
        if (PassResponseHeader(name)) dst.insert(f.name_string(), f.value());
      }
    };
    const auto length = p.content_length();
    if (p.is_done() || (length && *length <= kWholeBelow)) {
      http::Response res;
      res.result(uh.result_int());
      res.reason(uh.reason());
      copy_fields(res);
      std::string body;
      if (length) body.reserve(*length);
      while (!p.is_done()) {
        auto n = co_await next_piece();
        if (!n.ok()) {
          out.error = n.status();
          co_return;
        }
        body.append(buf.get(), *n);
      }
      res.body() = std::move(body);
      out.whole = std::move(res);
      answered = ubuf.size() == 0;
      co_return;
    }
    bhttp::response_header<> header;
    header.result(uh.result_int());
    header.reason(uh.reason());
    copy_fields(header);
    header.version(req.version());
    if (!req.keep_alive()) header.set(bhttp::field::connection, "close");
    out.began = true;
    if (!co_await ctx.stream.Begin(std::move(header))) co_return;
    std::vector<asio::const_buffer> pieces(1);
    while (!p.is_done()) {
      auto n = co_await next_piece();
      if (!n.ok()) co_return;  // the client sees the chunked body end without its last chunk
      if (*n == 0) continue;
      pieces[0] = asio::buffer(buf.get(), *n);
      if (!co_await ctx.stream.WriteBuffers(pieces)) co_return;
    }
    answered = ubuf.size() == 0;  // read whole, and nothing after it
    co_await ctx.stream.End();
  };

  // Only the upstream is closed when idle: the client then gets the 502 (no answer yet) or
  // sees the streamed body end.
  auto exchange = upload() && relay();
  co_await act.Run(std::move(exchange), up, nullptr);
  // Kept only after a clean exchange both ways: a connection left mid-request or mid-response
  // would hand the next request the rest of this one.
  out.reusable = answered && keep_alive && upload_done && up.is_open();
  co_return out;
}

}  // namespace sbx::api
