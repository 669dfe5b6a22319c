// Port exposure (docs/api.md, "Ports"): /v1/sandboxes/{id}/ports/{port}/<rest> and
// Host: {port}-{id}.{ports.domain} reach a server listening in the sandbox. sbxd opens the
// upstream connection inside the sandbox's network namespace (runtime::Instance::DialPort), so a
// server bound to the sandbox's 127.0.0.1 or ::1 is reached as well as one on 0.0.0.0, whatever
// the egress profile: this is ingress through sbxd, and no egress rule is involved.
//
// One upstream connection per request (Connection: close), the client's connection stays
// keep-alive. Bodies stream both ways without being held whole: the request body as the server
// reads it (RequestContext::body), the response as the upstream sends it; each piece the upstream
// sends is written at once (Server-Sent Events arrive event by event). A small response of known
// length goes out in one write instead. An Upgrade request (WebSocket) takes the connection over:
// after the request head sbxd relays bytes both ways until either side closes.
#include <sys/socket.h>

#include <cctype>
#include <chrono>
#include <cstdlib>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/port_target.h"
#include "common/log.h"
#include "common/status_util.h"

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

asio::awaitable<void> Pump(tcp::socket& from, tcp::socket& to, IdleWatch& act) {
  std::vector<char> buf(kPiece);
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), kTuple);
    if (ec) break;
    act.Touch();
    auto [wec, wn] = co_await asio::async_write(to, asio::buffer(buf.data(), n), kTuple);
    if (wec) break;
  }
  boost::system::error_code ignored;
  to.shutdown(tcp::socket::shutdown_send, ignored);
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
                                                                      const PortAddress& a) {
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
    if (auto c = Authenticate(req, std::nullopt, /*allow_attach_token=*/false); c.ok()) {
      creds.caller = std::move(*c);
      used_authorization = true;
    }
  }
  creds.traffic_token = HeaderValue(req, kTrafficTokenHeader);
  if (!creds.traffic_token) creds.traffic_token = HeaderValue(req, kE2bTrafficTokenHeader);
  auto tenant = log::With(ctx.log, [&] { return svc_.AuthorizePort(a.sandbox_id, creds); });
  if (!tenant.ok()) co_return Fail(ctx, tenant.status());
  ctx.log.tenant = *tenant;
  ctx.log.sandbox = a.sandbox_id;

  const bool upgrade = WantsUpgrade(req);
  auto upstream = co_await DialUpstream(ctx, a);
  if (!upstream.ok()) co_return Fail(ctx, upstream.status());
  tcp::socket& up = *upstream;

  UpstreamHeadOptions ho;
  ho.strip_authorization = used_authorization;
  ho.upgrade = upgrade && ctx.connection != nullptr;
  ho.has_body = ctx.body != nullptr;
  if (ho.has_body) {
    auto cl = req.find(bhttp::field::content_length);
    if (cl != req.end()) ho.content_length = std::strtoull(std::string(cl->value()).c_str(), nullptr, 10);
  }
  if (ctx.connection != nullptr) {
    boost::system::error_code ec;
    auto ep = ctx.connection->socket().remote_endpoint(ec);
    if (!ec) ho.forwarded_for = ep.address().to_string();
  }
  const std::string head = UpstreamHead(req, a.upstream_target, ho);

  if (ho.upgrade) {
    // The connection is the upstream's from here: its 101 (or refusal) goes to the client as
    // the upstream wrote it.
    auto [ec, n] = co_await asio::async_write(up, asio::buffer(head), kTuple);
    if (ec) co_return Fail(ctx, Unreachable(a, fmt::format("send request: {}", ec.message())));
    ctx.taken_status = 101;
    ctx.connection->expires_never();
    tcp::socket& client = ctx.connection->socket();
    IdleWatch act(up.get_executor(), opts_.port_idle_timeout);
    auto both_ways = Pump(client, up, act) && Pump(up, client, act);
    co_await act.Run(std::move(both_ways), up, &client);
    co_return std::nullopt;
  }

  // Request: the head, then the body as it arrives.
  IdleWatch act(up.get_executor(), opts_.port_idle_timeout);
  bool upload_failed = false;
  absl::Status upload_error;
  auto upload = [&]() -> asio::awaitable<void> {
    auto [ec, n] = co_await asio::async_write(up, asio::buffer(head), kTuple);
    if (ec) {
      upload_failed = true;
      co_return;
    }
    if (!ho.has_body) co_return;
    std::vector<char> buf(kPiece);
    std::vector<asio::const_buffer> bufs;
    const bool chunked = !ho.content_length;
    for (;;) {
      auto got = co_await ctx.body->ReadSome(buf.data(), buf.size());
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
          (void)wec;
        }
        co_return;
      }
      bufs.clear();
      if (chunked) {
        frame = fmt::format("{:x}\r\n", *got);
        bufs.push_back(asio::buffer(frame));
      }
      bufs.push_back(asio::buffer(buf.data(), *got));
      if (chunked) bufs.push_back(asio::buffer("\r\n", 2));
      auto [wec, wn] = co_await asio::async_write(up, bufs, kTuple);
      if (wec) {
        // The upstream stopped reading (it answered early, or closed): its answer still counts.
        co_return;
      }
    }
  };

  // Response: the head, then the body piece by piece.
  std::optional<http::Response> whole;
  absl::Status relay_error;
  bool began = false;
  auto relay = [&]() -> asio::awaitable<void> {
    beast::flat_buffer ubuf;
    bhttp::response_parser<bhttp::buffer_body> p;
    p.header_limit(kMaxUpstreamHeader);
    p.body_limit(boost::none);
    if (req.method() == bhttp::verb::head) p.skip(true);
    {
      auto [ec, n] = co_await bhttp::async_read_header(up, ubuf, p, kTuple);
      if (ec) {
        relay_error = upload_failed && !upload_error.ok()
                          ? upload_error
                          : Unreachable(a, fmt::format("no answer ({})", ec.message()));
        co_return;
      }
    }
    const auto& uh = p.get();
    std::vector<char> buf(kPiece);
    auto next_piece = [&]() -> asio::awaitable<absl::StatusOr<size_t>> {
      p.get().body().data = buf.data();
      p.get().body().size = buf.size();
      auto [ec, n] = co_await bhttp::async_read_some(up, ubuf, p, kTuple);
      act.Touch();
      if (ec && ec != bhttp::error::need_buffer) {
        co_return Unreachable(a, fmt::format("response broke off ({})", ec.message()));
      }
      co_return buf.size() - p.get().body().size;
    };
    auto copy_fields = [&](auto& out) {
      for (const auto& f : uh) {
        const std::string_view name(f.name_string().data(), f.name_string().size());
        if (PassResponseHeader(name)) out.insert(f.name_string(), f.value());
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
          relay_error = n.status();
          co_return;
        }
        body.append(buf.data(), *n);
      }
      res.body() = std::move(body);
      whole = std::move(res);
      co_return;
    }
    bhttp::response_header<> header;
    header.result(uh.result_int());
    header.reason(uh.reason());
    copy_fields(header);
    header.version(req.version());
    if (!req.keep_alive()) header.set(bhttp::field::connection, "close");
    began = true;
    if (!co_await ctx.stream.Begin(std::move(header))) co_return;
    std::vector<asio::const_buffer> out(1);
    while (!p.is_done()) {
      auto n = co_await next_piece();
      if (!n.ok()) co_return;  // the client sees the chunked body end without its last chunk
      if (*n == 0) continue;
      out[0] = asio::buffer(buf.data(), *n);
      if (!co_await ctx.stream.WriteBuffers(out)) co_return;
    }
    co_await ctx.stream.End();
  };

  // Only the upstream is closed when idle: the client then gets the 502 (no answer yet) or
  // sees the streamed body end.
  auto exchange = upload() && relay();
  co_await act.Run(std::move(exchange), up, nullptr);
  if (whole) co_return std::move(whole);
  if (!began) co_return Fail(ctx, relay_error.ok() ? Unreachable(a, "no answer") : relay_error);
  co_return std::nullopt;
}

}  // namespace sbx::api
