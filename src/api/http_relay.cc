#include "api/http_relay.h"

#include <cctype>
#include <memory>
#include <vector>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>

#include "common/tls_stream.h"
#include "http/lazy_deadline.h"

namespace sbx::api::relay {
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

// Ends a relay once nothing has moved for `idle`: closing the sockets fails their pending reads
// and writes, so the relay's own error paths end it (never a cancelled write half-way into the
// client's stream). Without it a server in the sandbox that never answers, or a WebSocket both
// ends abandoned, would hold the descriptors, and the sandbox's network namespace they keep
// alive, for ever. A lazy deadline pushed at each piece (a store), not a coroutine raced
// against the relay (two coroutines and a parallel group per proxied request, issue 16's port
// round trip). Its sockets must outlive it.
class IdleWatch {
 public:
  IdleWatch(const asio::any_io_executor& ex, std::chrono::seconds idle, tcp::socket& a,
            tcp::socket* b)
      : idle_(idle), deadline_(ex, [&a, b] {
          boost::system::error_code ignored;
          a.close(ignored);
          if (b != nullptr) b->close(ignored);
        }) {
    Touch();
  }
  void Touch() { deadline_.ExpiresAfter(idle_); }

 private:
  const std::chrono::seconds idle_;
  http::LazyDeadline deadline_;
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

// Bytes one way until the source ends or either side fails; then the end is passed on
// (shutdown of the sending side), so a half-closed WebSocket or TCP stream stays half-closed.
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

bool WantsUpgrade(const http::Request& req) {
  if (req.find(bhttp::field::upgrade) == req.end()) return false;
  std::string conn(req[bhttp::field::connection]);
  for (char& c : conn) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return conn.find("upgrade") != std::string::npos;
}

asio::awaitable<void> Tunnel(http::RequestContext& ctx, tcp::socket& up, std::chrono::seconds idle) {
  ctx.taken_status = 101;
  ctx.connection->tcp().expires_never();
  // Plain or TLS alike: the client's side is the connection's stream, whose TLS (if any) sbxd
  // ends; the upstream is plain TCP.
  MaybeTlsStream& client = *ctx.connection;
  IdleWatch act(up.get_executor(), idle, up, &client.tcp().socket());
  co_await (Pump(client, up, act) && Pump(up, client, act));
}

asio::awaitable<ExchangeResult> Exchange(http::RequestContext& ctx, tcp::socket& up,
                                         const std::string& head, const UpstreamHeadOptions& ho,
                                         std::chrono::seconds idle, const Unreachable& unreachable) {
  const http::Request& req = ctx.req;
  ExchangeResult out;
  // Only the upstream is closed when idle: the client then gets the 502 (no answer yet) or
  // sees the streamed body end.
  IdleWatch act(up.get_executor(), idle, up, nullptr);
  // Request: the head, then the body as it arrives.
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
                        : unreachable(fmt::format("no answer ({})", ec.message()));
        co_return;
      }
    }
    const auto& uh = p.get();
    // A 1xx is not the answer, and what follows it is not relayed as one: not kept.
    keep_alive = p.keep_alive() && uh.result_int() >= 200;
    std::unique_ptr<char[]> buf(new char[kPiece]);  // not zeroed: every byte is read into first
    // Reads the next piece of the body into buf + `at`.
    auto next_piece = [&](size_t at = 0) -> asio::awaitable<absl::StatusOr<size_t>> {
      p.get().body().data = buf.get() + at;
      p.get().body().size = kPiece - at;
      auto [ec, n] = co_await bhttp::async_read_some(up, ubuf, p, kTuple);
      act.Touch();
      if (ec && ec != bhttp::error::need_buffer) {
        co_return unreachable(fmt::format("response broke off ({})", ec.message()));
      }
      co_return kPiece - at - p.get().body().size;
    };
    // The chunked body's end (no trailers) is read already: parsing it needs no more bytes.
    auto end_is_read = [&] {
      std::string_view rest(static_cast<const char*>(ubuf.data().data()), ubuf.size());
      if (rest.starts_with("\r\n")) rest.remove_prefix(2);
      return rest == "0\r\n\r\n";
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
    // Body bytes that came with the header make the first piece immediate: the header waits
    // for it, and a piece that ends the body goes with the end (a node's answer for a process
    // that is over arrives whole, and leaves in one write instead of three).
    if (!co_await ctx.stream.Begin(std::move(header), /*hold=*/ubuf.size() > 0)) co_return;
    std::vector<asio::const_buffer> pieces(1);
    while (!p.is_done()) {
      auto n = co_await next_piece();
      if (!n.ok()) co_return;  // the client sees the chunked body end without its last chunk
      if (*n == 0) continue;
      size_t have = *n;
      if (!p.is_done() && have < kPiece && end_is_read()) {
        auto m = co_await next_piece(have);
        if (!m.ok()) co_return;
        have += *m;
      }
      pieces[0] = asio::buffer(buf.get(), have);
      const bool sent = p.is_done() ? co_await ctx.stream.WriteLast(pieces)
                                    : co_await ctx.stream.WriteBuffers(pieces);
      if (!sent) co_return;
    }
    answered = ubuf.size() == 0;  // read whole, and nothing after it
    co_await ctx.stream.End();
  };

  if (ho.has_body) {
    // The server may answer before it has read the body (an error, a redirect): both at once.
    co_await (upload() && relay());
  } else {
    // A head alone goes out in one write that does not wait for the server (it fits in the
    // socket's buffer; an idle watch closes a connection that stalls even so): one coroutine
    // fewer, and no parallel group, per request.
    co_await upload();
    co_await relay();
  }
  // Kept only after a clean exchange both ways: a connection left mid-request or mid-response
  // would hand the next request the rest of this one.
  out.reusable = answered && keep_alive && upload_done && up.is_open();
  co_return out;
}

}  // namespace sbx::api::relay
