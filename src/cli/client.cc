#include "cli/client.h"

#include <unistd.h>

#include <array>
#include <cctype>
#include <csignal>
#include <cstring>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <fmt/format.h>

#include "common/ids.h"
#include "cli/tls.h"
#include "common/status_util.h"
#include "common/tls_stream.h"

namespace sbx::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr std::string_view kUserAgent = "sbx-cli/" SBX_VERSION;
constexpr size_t kMaxJsonBody = 64u << 20;
constexpr size_t kMaxErrorBody = 1u << 20;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Truncate(std::string_view s, size_t n) {
  std::string out(s.substr(0, n));
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (s.size() > n) out += "…";
  return out;
}

absl::Status StatusForHttp(unsigned status, std::string message) {
  switch (status) {
    case 400: return absl::InvalidArgumentError(message);
    case 401: return absl::UnauthenticatedError(message);
    case 403: return absl::PermissionDeniedError(message);
    case 404: return absl::NotFoundError(message);
    case 409: return absl::FailedPreconditionError(message);
    case 413: return absl::OutOfRangeError(message);
    case 422: return absl::InvalidArgumentError(message);
    case 429: return absl::ResourceExhaustedError(message);
    case 501: return absl::UnimplementedError(message);
    case 503: return absl::UnavailableError(message);
    case 500: return absl::InternalError(message);
    default: return absl::UnknownError(message);
  }
}

std::string HostHeader(const Endpoint& ep) {
  if (ep.host.find(':') != std::string::npos) return fmt::format("[{}]:{}", ep.host, ep.port);
  return fmt::format("{}:{}", ep.host, ep.port);
}

}  // namespace

absl::StatusOr<Endpoint> ParseUrl(std::string_view url) {
  Endpoint ep;
  std::string_view rest = url;
  size_t scheme_end = rest.find("://");
  if (scheme_end == std::string_view::npos) {
    return absl::InvalidArgumentError(
        fmt::format("invalid sbxd URL \"{}\": expected http://HOST[:PORT]", url));
  }
  std::string scheme = Lower(rest.substr(0, scheme_end));
  if (scheme != "http" && scheme != "https") {
    return absl::InvalidArgumentError(fmt::format(
        "invalid sbxd URL \"{}\": only http:// and https:// are supported (got {}://)", url,
        scheme));
  }
  ep.scheme = scheme;
  rest.remove_prefix(scheme_end + 3);
  size_t path_start = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, path_start);
  std::string_view path = path_start == std::string_view::npos ? "" : rest.substr(path_start);
  if (path.find_first_of("?#") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        fmt::format("invalid sbxd URL \"{}\": a query or fragment is not allowed", url));
  }
  if (authority.find('@') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        fmt::format("invalid sbxd URL \"{}\": credentials in the URL are not supported; use "
                    "SBX_TOKEN",
                    url));
  }
  std::string_view host = authority;
  std::string_view port = scheme == "https" ? "443" : "80";
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format("invalid sbxd URL \"{}\": unclosed [", url));
    }
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return absl::InvalidArgumentError(fmt::format("invalid sbxd URL \"{}\"", url));
      }
      port = after.substr(1);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(fmt::format("invalid sbxd URL \"{}\": no host", url));
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string_view::npos ||
      std::stoul(std::string(port)) == 0 || std::stoul(std::string(port)) > 65535) {
    return absl::InvalidArgumentError(fmt::format("invalid sbxd URL \"{}\": bad port", url));
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  ep.host = std::string(host);
  ep.port = std::string(port);
  ep.base_path = std::string(path);
  std::string_view shown = url;
  while (!shown.empty() && shown.back() == '/') shown.remove_suffix(1);
  ep.url = std::string(shown);
  return ep;
}

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

absl::Status DecodeHttpError(unsigned status, std::string_view body,
                             std::string_view request_id) {
  std::string code;
  std::string message;
  std::string field;
  std::string rid(request_id);
  nlohmann::json j = ParseUntrustedJson(body, kMaxResponseJsonDepth).value_or(nlohmann::json());
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const auto& e = j["error"];
    if (e.contains("code") && e["code"].is_string()) code = e["code"].get<std::string>();
    if (e.contains("message") && e["message"].is_string()) {
      message = e["message"].get<std::string>();
    }
    if (e.contains("request_id") && e["request_id"].is_string()) {
      rid = e["request_id"].get<std::string>();
    }
    if (e.contains("details") && e["details"].is_object() && e["details"].contains("field") &&
        e["details"]["field"].is_string()) {
      field = e["details"]["field"].get<std::string>();
    }
  }
  std::string text;
  if (!code.empty()) {
    text = fmt::format("{} {}: {}", status, code, Truncate(message, 500));
  } else {
    std::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
    text = fmt::format("{} {}", status, reason);
    if (!body.empty()) text += fmt::format(": {}", Truncate(body, 200));
  }
  std::vector<std::string> notes;
  if (!field.empty()) notes.push_back(fmt::format("field {}", field));
  if (!rid.empty()) notes.push_back(fmt::format("request {}", rid));
  if (!notes.empty()) text += fmt::format(" ({})", fmt::join(notes, ", "));
  return StatusForHttp(status, std::move(text));
}

std::string NewIdempotencyKey() { return "sbx-cli-" + sbx::NewSecret(18); }

struct Client::Impl {
  asio::io_context ioc;
  std::optional<MaybeTlsStream> stream;
  beast::flat_buffer buffer;
  asio::steady_timer timer{ioc};
  std::optional<asio::signal_set> signals;

  // Starts one async operation through `initiate(handler)` and runs the io_context until it
  // completes (signal handlers run in here too). Returns the operation's error.
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
      if (ioc.run_one() == 0) return asio::error::interrupted;  // no work left: cannot happen
    }
    return ec;
  }

  void Close() {
    if (stream) {
      error_code ignored;
      stream->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream->tcp().close();
      stream.reset();
    }
    buffer.clear();
  }
};

Client::Client(Endpoint endpoint, std::string token)
    : endpoint_(std::move(endpoint)), token_(std::move(token)), impl_(std::make_unique<Impl>()) {}

Client::~Client() = default;

void Client::CatchInterrupts() {
  if (impl_->signals) return;
  impl_->signals.emplace(impl_->ioc, SIGINT, SIGTERM);
  // Re-armed after every delivery so that a second signal is seen while cleanup runs.
  struct Arm {
    Client* self;
    void operator()() const {
      self->impl_->signals->async_wait([self = self](const error_code& ec, int sig) {
        if (ec) return;
        if (self->interrupt_signal_ != 0) {
          std::string note = fmt::format("\nsbx: interrupted again (signal {}); exiting now",
                                         sig);
          if (!self->second_signal_note_.empty()) note += "; " + self->second_signal_note_;
          note += "\n";
          ssize_t ignored = ::write(STDERR_FILENO, note.data(), note.size());
          (void)ignored;
          ::_exit(128 + sig);
        }
        self->interrupt_signal_ = sig;
        if (self->impl_->stream) self->impl_->stream->tcp().cancel();
        self->impl_->timer.cancel();
        Arm{self}();
      });
    }
  };
  Arm{this}();
}

absl::Status Client::Connect() {
  impl_->Close();
  tcp::resolver resolver(impl_->ioc);
  error_code ec;
  auto results = resolver.resolve(endpoint_.host, endpoint_.port, ec);
  if (ec) {
    return absl::UnavailableError(
        fmt::format("cannot reach sbxd at {}: {}", endpoint_.url, ec.message()));
  }
  impl_->stream.emplace(impl_->ioc);
  beast::tcp_stream& tcp = impl_->stream->tcp();
  tcp.expires_after(connect_timeout);
  ec = impl_->Run([&](auto handler) { tcp.async_connect(results, handler); });
  if (ec) {
    impl_->Close();
    if (interrupted() && ec == asio::error::operation_aborted) {
      return absl::CancelledError("interrupted");
    }
    std::string why = ec == beast::error::timeout ? "connection timed out" : ec.message();
    return absl::UnavailableError(fmt::format("cannot reach sbxd at {}: {}", endpoint_.url, why));
  }
  if (!endpoint_.https()) return absl::OkStatus();
  if (auto st = PrepareTls(*impl_->stream, endpoint_); !st.ok()) {
    impl_->Close();
    return st;
  }
  // The handshake shares the connect's deadline.
  ec = impl_->Run([&](auto handler) {
    impl_->stream->tls()->async_handshake(asio::ssl::stream_base::client, handler);
  });
  if (ec) {
    absl::Status st = interrupted() && ec == asio::error::operation_aborted
                          ? absl::CancelledError("interrupted")
                          : TlsHandshakeError(ec, *impl_->stream, endpoint_);
    impl_->Close();
    return st;
  }
  return absl::OkStatus();
}

absl::Status Client::TransportError(const error_code& ec, std::string_view what,
                                    std::chrono::seconds timeout) {
  impl_->Close();
  if (interrupted() && ec == asio::error::operation_aborted) {
    return absl::CancelledError("interrupted");
  }
  if (ec == beast::error::timeout) {
    return absl::DeadlineExceededError(fmt::format("{}: sbxd at {} sent nothing for {} s", what,
                                                   endpoint_.url, timeout.count()));
  }
  return absl::UnavailableError(
      fmt::format("{}: connection to sbxd at {} failed: {}", what, endpoint_.url, ec.message()));
}

absl::StatusOr<HttpResult> Client::Request(std::string_view method, std::string_view target,
                                           const nlohmann::json* body,
                                           std::string_view idempotency_key) {
  http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) {
    return absl::InvalidArgumentError(fmt::format("unknown HTTP method {}", method));
  }
  http::request<http::string_body> req{verb, endpoint_.base_path + std::string(target), 11};
  req.set(http::field::host, HostHeader(endpoint_));
  req.set(http::field::user_agent, kUserAgent);
  req.set(http::field::accept, "application/json");
  req.set(http::field::authorization, "Bearer " + token_);
  if (!idempotency_key.empty()) req.set("Idempotency-Key", idempotency_key);
  if (body != nullptr) {
    req.set(http::field::content_type, "application/json");
    req.body() = body->dump();
  }
  req.keep_alive(true);
  req.prepare_payload();
  const std::string what = fmt::format("{} {}", method, target);

  for (int attempt = 0;; ++attempt) {
    bool reused = impl_->stream.has_value();
    if (!reused) SBX_RETURN_IF_ERROR(Connect());
    auto& stream = *impl_->stream;
    stream.tcp().expires_after(request_timeout);
    error_code ec = impl_->Run([&](auto handler) { http::async_write(stream, req, handler); });
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxJsonBody);
    if (!ec) {
      ec = impl_->Run(
          [&](auto handler) { http::async_read(stream, impl_->buffer, parser, handler); });
    }
    if (ec) {
      // A keep-alive connection the server had already closed: nothing of this request was
      // processed, so one retry on a fresh connection is safe.
      if (reused && attempt == 0 && !parser.got_some() &&
          !(interrupted() && ec == asio::error::operation_aborted)) {
        impl_->Close();
        continue;
      }
      return TransportError(ec, what, request_timeout);
    }
    auto& res = parser.get();
    if (!res.keep_alive()) impl_->Close();
    HttpResult out;
    out.status = res.result_int();
    out.request_id = std::string(res["X-Request-Id"]);
    out.replayed = Lower(res["Idempotent-Replayed"]) == "true";
    if (out.status < 200 || out.status > 299) {
      return DecodeHttpError(out.status, res.body(), out.request_id);
    }
    if (!res.body().empty()) {
      auto parsed = ParseUntrustedJson(res.body(), kMaxResponseJsonDepth);
      if (!parsed.ok()) {
        return absl::InternalError(fmt::format("{}: sbxd returned invalid JSON ({}): {}", what,
                                               std::string(parsed.status().message()),
                                               Truncate(res.body(), 200)));
      }
      out.body = std::move(*parsed);
    }
    return out;
  }
}

absl::StatusOr<nlohmann::json> Client::Get(std::string_view target) {
  auto r = Request("GET", target);
  if (!r.ok()) return r.status();
  return std::move(r->body);
}

absl::Status Client::Stream(const StreamOptions& opts, const SseHandler& handler,
                            StreamInfo* info) {
  StreamInfo ignored_info;
  if (info == nullptr) info = &ignored_info;
  *info = StreamInfo{};
  // A stream gets its own connection: it may be long, and the server may close it at the end.
  SBX_RETURN_IF_ERROR(Connect());
  info->connected = true;
  auto& stream = *impl_->stream;

  const bool create = !opts.create_body.empty();
  http::request<http::string_body> req{create ? http::verb::post : http::verb::get,
                                       endpoint_.base_path + opts.target, 11};
  req.set(http::field::host, HostHeader(endpoint_));
  req.set(http::field::user_agent, kUserAgent);
  req.set(http::field::accept, fmt::format("{}, text/event-stream;q=0.9", kBinaryAttachType));
  req.set(http::field::cache_control, "no-cache");
  req.set(http::field::authorization, "Bearer " + (opts.token.empty() ? token_ : opts.token));
  if (!opts.last_event_id.empty()) req.set("Last-Event-ID", opts.last_event_id);
  if (create) {
    if (!opts.idempotency_key.empty()) req.set("Idempotency-Key", opts.idempotency_key);
    req.set(http::field::content_type, "application/json");
    req.body() = opts.create_body;
    req.prepare_payload();
  }
  stream.tcp().expires_after(request_timeout);
  error_code ec = impl_->Run([&](auto handler) { http::async_write(stream, req, handler); });
  if (ec) return TransportError(ec, "attach", request_timeout);

  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  stream.tcp().expires_after(request_timeout);
  ec = impl_->Run(
      [&](auto handler) { http::async_read_header(stream, impl_->buffer, parser, handler); });
  if (ec) return TransportError(ec, "attach", request_timeout);

  std::array<char, 64 * 1024> buf;
  // Beast sizes each socket read by the buffer's free capacity (at least 512 bytes): without
  // room, a stream of 200 KiB events is read 512 bytes per syscall.
  impl_->buffer.reserve(256 << 10);
  // Reads whatever is available into `buf` (at most one socket read): returns the byte count.
  auto read_some = [&](std::chrono::seconds timeout, error_code& read_ec) -> size_t {
    parser.get().body().data = buf.data();
    parser.get().body().size = buf.size();
    stream.tcp().expires_after(timeout);
    read_ec = impl_->Run(
        [&](auto handler) { http::async_read_some(stream, impl_->buffer, parser, handler); });
    if (read_ec == http::error::need_buffer) read_ec = {};
    return buf.size() - parser.get().body().size;
  };

  unsigned status = parser.get().result_int();
  std::string request_id(parser.get()["X-Request-Id"]);
  if (status != 200) {
    std::string body;
    while (!parser.is_done() && body.size() < kMaxErrorBody) {
      size_t n = read_some(request_timeout, ec);
      body.append(buf.data(), n);
      if (ec) break;
    }
    impl_->Close();
    return DecodeHttpError(status, body, request_id);
  }
  std::string content_type = Lower(parser.get()[http::field::content_type]);
  const bool binary = content_type.rfind(kBinaryAttachType, 0) == 0;
  if (!binary && content_type.rfind("text/event-stream", 0) != 0) {
    impl_->Close();
    return absl::InternalError(fmt::format(
        "attach: sbxd answered with Content-Type \"{}\", not text/event-stream (request {})",
        content_type, request_id));
  }

  info->got_response = true;
  info->session_id = std::string(parser.get()["Sbx-Session-Id"]);
  SseParser sse;
  BinaryAttachParser bin;
  // Events are handled as the parsers complete them, in buffers the parsers reuse: output
  // events run to hundreds of KiB, and a fresh buffer for each cost the client more CPU than
  // sbxd spent sending them. The first handler that stops (or fails) ends the stream; events
  // after it in the same read are not handled.
  std::optional<absl::StatusOr<bool>> stop;
  AttachEvent converted;
  auto handle = [&](const AttachEvent& ev) {
    if (stop) return;
    absl::StatusOr<bool> more = handler(ev);
    if (!more.ok() || !*more) stop = std::move(more);
  };
  while (!parser.is_done()) {
    size_t n = read_some(opts.idle_timeout, ec);
    if (n > 0) {
      const std::string_view got(buf.data(), n);
      absl::Status fed;
      if (binary) {
        fed = bin.Feed(got, handle);
      } else {
        // Swapped, not copied: the parser refills each field before its next event.
        fed = sse.Feed(got, [&](SseEvent& e) {
          converted.id.swap(e.id);
          converted.type.swap(e.type);
          converted.data.swap(e.data);
          handle(converted);
        });
      }
      if (stop) {
        impl_->Close();
        return stop->ok() ? absl::OkStatus() : stop->status();
      }
      if (!fed.ok()) {
        impl_->Close();
        return fed;
      }
    }
    if (ec) return TransportError(ec, "attach stream", opts.idle_timeout);
  }
  impl_->Close();
  info->ended_mid_event = binary ? bin.HasPartialEvent() : sse.HasPartialEvent();
  return absl::OkStatus();
}

absl::Status Client::Sleep(std::chrono::milliseconds d) {
  impl_->timer.expires_after(d);
  error_code ec = impl_->Run([&](auto handler) { impl_->timer.async_wait(handler); });
  if (ec == asio::error::operation_aborted && interrupted()) {
    return absl::CancelledError("interrupted");
  }
  return absl::OkStatus();
}

}  // namespace sbx::cli
