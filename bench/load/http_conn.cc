#include "load/http_conn.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <array>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::load {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr std::string_view kUserAgent = "sbx-load/" SBX_VERSION;
constexpr size_t kMaxBody = 64u << 20;

std::string HostHeader(const cli::Endpoint& ep) {
  if (ep.host.find(':') != std::string::npos) return fmt::format("[{}]:{}", ep.host, ep.port);
  return fmt::format("{}:{}", ep.host, ep.port);
}

}  // namespace

absl::Status HttpResponse::AsError() const {
  return cli::DecodeHttpError(status, body, request_id);
}

struct HttpConn::Impl {
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::optional<tcp::resolver::results_type> resolved;

  // Runs one async operation to completion on this thread: async steps are what give
  // beast::tcp_stream its per-step deadlines, which blocking calls would not have.
  template <typename Initiate>
  error_code Run(Initiate&& initiate) {
    error_code ec = asio::error::would_block;
    bool done = false;
    initiate([&](const error_code& e, auto&&...) {
      ec = e;
      done = true;
    });
    ioc.restart();
    while (!done) {
      if (ioc.run_one() == 0) return asio::error::interrupted;
    }
    return ec;
  }
};

HttpConn::HttpConn(cli::Endpoint endpoint, std::string token)
    : endpoint_(std::move(endpoint)), token_(std::move(token)), impl_(std::make_unique<Impl>()) {
  // Beast sizes each socket read by the buffer's free capacity (at least 512 bytes, at most
  // 64 KiB). A buffer that is emptied after every read never grows, so without this an attach
  // stream is read 512 bytes per syscall and the client, not sbxd, limits the throughput.
  impl_->buffer.reserve(256 * 1024);
}

HttpConn::~HttpConn() { Close(); }

void HttpConn::Close() {
  if (impl_->stream) {
    error_code ignored;
    impl_->stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    impl_->stream->close();
    impl_->stream.reset();
  }
  impl_->buffer.clear();  // keeps the capacity
}

absl::Status HttpConn::TransportError(std::string_view what, const error_code& ec) {
  Close();
  std::string why = ec == beast::error::timeout
                        ? fmt::format("no answer within {} s", timeout.count())
                        : ec.message();
  return absl::UnavailableError(fmt::format("{}: sbxd at {}: {}", what, endpoint_.url, why));
}

absl::Status HttpConn::Connect() {
  Close();
  if (!impl_->resolved) {
    tcp::resolver resolver(impl_->ioc);
    error_code ec;
    auto results = resolver.resolve(endpoint_.host, endpoint_.port, ec);
    if (ec) {
      return absl::UnavailableError(
          fmt::format("connect: resolve {}: {}", endpoint_.url, ec.message()));
    }
    impl_->resolved = std::move(results);
  }
  impl_->stream.emplace(impl_->ioc);
  impl_->stream->expires_after(std::chrono::seconds(10));
  error_code ec =
      impl_->Run([&](auto handler) { impl_->stream->async_connect(*impl_->resolved, handler); });
  if (ec) return TransportError("connect", ec);
  // Small requests and SSE frames must not wait for Nagle: that would be measured as latency.
  impl_->stream->socket().set_option(tcp::no_delay(true), ec);
  return absl::OkStatus();
}

absl::StatusOr<HttpResponse> HttpConn::Call(std::string_view method, std::string_view target,
                                            const nlohmann::json* body) {
  http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) {
    return absl::InvalidArgumentError(fmt::format("unknown HTTP method {}", method));
  }
  http::request<http::string_body> req{verb, endpoint_.base_path + std::string(target), 11};
  req.set(http::field::host, HostHeader(endpoint_));
  req.set(http::field::user_agent, kUserAgent);
  req.set(http::field::accept, "application/json");
  req.set(http::field::authorization, "Bearer " + token_);
  if (body != nullptr) {
    req.set(http::field::content_type, "application/json");
    req.body() = body->dump();
  }
  req.keep_alive(true);
  req.prepare_payload();
  const std::string what = fmt::format("{} {}", method, target);

  for (int attempt = 0;; ++attempt) {
    bool reused = impl_->stream.has_value();
    if (!reused) SBX_RETURN_IF_ERROR(Annotate(Connect(), what));
    auto& stream = *impl_->stream;
    stream.expires_after(timeout);
    error_code ec = impl_->Run([&](auto handler) { http::async_write(stream, req, handler); });
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxBody);
    if (!ec) {
      ec = impl_->Run(
          [&](auto handler) { http::async_read(stream, impl_->buffer, parser, handler); });
    }
    if (ec) {
      // The server closed an idle keep-alive connection before it read this request: nothing
      // was processed, so one retry on a fresh connection cannot duplicate a create.
      if (reused && attempt == 0 && !parser.got_some()) {
        Close();
        continue;
      }
      return TransportError(what, ec);
    }
    auto& res = parser.get();
    HttpResponse out;
    out.status = res.result_int();
    out.request_id = std::string(res["X-Request-Id"]);
    out.body = std::move(res.body());
    if (!res.keep_alive()) Close();
    return out;
  }
}

absl::StatusOr<nlohmann::json> HttpConn::Json(std::string_view method, std::string_view target,
                                              const nlohmann::json* body) {
  SBX_ASSIGN_OR_RETURN(HttpResponse res, Call(method, target, body));
  if (res.status < 200 || res.status > 299) {
    return Annotate(res.AsError(), fmt::format("{} {}", method, target));
  }
  if (res.body.empty()) return nlohmann::json();
  nlohmann::json j = nlohmann::json::parse(res.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InternalError(
        fmt::format("{} {}: sbxd returned invalid JSON ({} bytes)", method, target,
                    res.body.size()));
  }
  return j;
}

absl::Status HttpConn::Stream(std::string_view target, std::string_view bearer,
                              const EventHandler& handler, std::string_view post_json) {
  const std::string what = fmt::format("attach {}", target);
  cli::SseParser sse;
  // Events are handled where the parser completes them, in its reused buffers: a copy of each
  // (hundreds of KiB) made this client, not sbxd, the bottleneck of the attach scenario.
  return StreamBytes(target, bearer, "text/event-stream",
                     [&](std::string_view bytes) -> absl::StatusOr<bool> {
                       std::optional<absl::StatusOr<bool>> stop;
                       absl::Status fed = sse.Feed(bytes, [&](const cli::SseEvent& ev) {
                         if (stop) return;
                         absl::StatusOr<bool> more = handler(ev);
                         if (!more.ok() || !*more) stop = std::move(more);
                       });
                       if (stop) return *std::move(stop);
                       if (!fed.ok()) return Annotate(fed, what);
                       return true;
                     },
                     post_json);
}

absl::Status HttpConn::StreamBytes(std::string_view target, std::string_view bearer,
                                   std::string_view accept, const BytesHandler& handler,
                                   std::string_view post_json) {
  const std::string what = fmt::format("attach {}", target);
  http::request<http::string_body> req{post_json.empty() ? http::verb::get : http::verb::post,
                                       endpoint_.base_path + std::string(target), 11};
  if (!post_json.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::string(post_json);
    req.prepare_payload();
  }
  req.set(http::field::host, HostHeader(endpoint_));
  req.set(http::field::user_agent, kUserAgent);
  req.set(http::field::accept, std::string(accept));
  req.set(http::field::authorization, fmt::format("Bearer {}", bearer));
  req.keep_alive(true);

  std::optional<http::response_parser<http::buffer_body>> parser_slot;
  for (int attempt = 0;; ++attempt) {
    parser_slot.emplace();
    parser_slot->body_limit(boost::none);
    auto& parser = *parser_slot;
    bool reused = impl_->stream.has_value();
    if (!reused) SBX_RETURN_IF_ERROR(Annotate(Connect(), what));
    auto& stream = *impl_->stream;
    stream.expires_after(timeout);
    error_code ec = impl_->Run([&](auto h) { http::async_write(stream, req, h); });
    if (!ec) {
      ec = impl_->Run(
          [&](auto h) { http::async_read_header(stream, impl_->buffer, parser, h); });
    }
    if (!ec) break;
    if (reused && attempt == 0 && !parser.got_some()) {
      Close();
      continue;
    }
    return TransportError(what, ec);
  }
  auto& parser = *parser_slot;
  auto& stream = *impl_->stream;

  std::array<char, 256 * 1024> buf;
  auto read_some = [&](error_code& ec) -> size_t {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    stream.expires_after(timeout);
    ec = impl_->Run([&](auto h) { http::async_read_some(stream, impl_->buffer, parser, h); });
    if (ec == http::error::need_buffer) ec = {};
    return buf.size() - parser.get().body().size;
  };

  unsigned status = parser.get().result_int();
  std::string request_id(parser.get()["X-Request-Id"]);
  if (status != 200) {
    std::string body;
    error_code ec;
    while (!parser.is_done() && body.size() < kMaxBody) {
      size_t n = read_some(ec);
      body.append(buf.data(), n);
      if (ec) break;
    }
    if (ec || !parser.get().keep_alive()) Close();
    return Annotate(cli::DecodeHttpError(status, body, request_id), what);
  }
  const bool keep_alive = parser.get().keep_alive();
  while (!parser.is_done()) {
    error_code ec;
    size_t n = read_some(ec);
    if (n > 0) {
      absl::StatusOr<bool> more = handler(std::string_view(buf.data(), n));
      if (!more.ok() || !*more) {
        Close();  // the rest of the response is unread: the connection cannot be reused
        return more.ok() ? absl::OkStatus() : more.status();
      }
    }
    if (ec) return TransportError(fmt::format("{} (reading the stream)", what), ec);
  }
  if (!keep_alive) Close();
  return absl::OkStatus();
}

}  // namespace sbx::load
