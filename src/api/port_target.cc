#include "api/port_target.h"

#include <cctype>

#include <fmt/format.h>

#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::api {
namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// Headers that belong to one connection, or that only sbxd reads.
bool HopByHop(std::string_view name) {
  for (std::string_view h : {"connection", "keep-alive", "proxy-connection", "te", "trailer",
                             "transfer-encoding", "upgrade", "content-length", "expect",
                             "proxy-authorization", "proxy-authenticate"}) {
    if (IEquals(name, h)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<uint16_t> ParsePortNumber(std::string_view text) {
  if (text.empty() || text.size() > 5 || text[0] == '0') {
    return FieldError("port", fmt::format("must be a number from 1 to 65535, got '{}'",
                                          std::string(text.substr(0, 16))));
  }
  uint32_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return FieldError("port", fmt::format("must be a number from 1 to 65535, got '{}'",
                                            std::string(text.substr(0, 16))));
    }
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (v < 1 || v > 65535) {
    return FieldError("port", fmt::format("must be a number from 1 to 65535, got {}", v));
  }
  return static_cast<uint16_t>(v);
}

std::optional<absl::StatusOr<PortAddress>> MatchPortPath(std::string_view target) {
  constexpr std::string_view kPrefix = "/v1/sandboxes/";
  if (target.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view rest = target.substr(kPrefix.size());
  const size_t id_end = rest.find_first_of("/?");
  if (id_end == std::string_view::npos || rest[id_end] != '/') return std::nullopt;
  const std::string_view id = rest.substr(0, id_end);
  rest.remove_prefix(id_end + 1);
  constexpr std::string_view kPorts = "ports/";
  if (rest.substr(0, kPorts.size()) != kPorts) return std::nullopt;
  rest.remove_prefix(kPorts.size());
  const size_t port_end = rest.find_first_of("/?");
  const std::string_view port_text = rest.substr(0, port_end);
  auto port = ParsePortNumber(port_text);
  if (!port.ok()) return absl::StatusOr<PortAddress>(port.status());
  PortAddress a;
  a.sandbox_id = std::string(id);
  a.port = *port;
  const std::string_view tail = port_end == std::string_view::npos ? "" : rest.substr(port_end);
  // "/v1/.../ports/8080?q" -> "/?q"; the rest is passed on as the client wrote it (not
  // decoded): the HTTP parser already refused CR, LF and spaces in a target.
  a.upstream_target = tail.empty() || tail[0] == '?' ? "/" + std::string(tail) : std::string(tail);
  return absl::StatusOr<PortAddress>(std::move(a));
}

std::optional<absl::StatusOr<PortAddress>> MatchPortHost(std::string_view host,
                                                        std::string_view target,
                                                        std::string_view domain) {
  if (domain.empty()) return std::nullopt;
  // Drop a :port (not inside an IPv6 literal, which never matches a domain anyway).
  if (size_t colon = host.rfind(':'); colon != std::string_view::npos &&
                                      host.find(']') == std::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  if (host.size() <= domain.size() + 1) return std::nullopt;
  const std::string_view suffix = host.substr(host.size() - domain.size());
  if (host[host.size() - domain.size() - 1] != '.' || !IEquals(suffix, domain)) {
    return std::nullopt;
  }
  const std::string_view label = host.substr(0, host.size() - domain.size() - 1);
  const size_t dash = label.find('-');
  if (label.find('.') != std::string_view::npos || dash == std::string_view::npos) {
    return absl::StatusOr<PortAddress>(FieldError(
        "host", fmt::format("a host under {} must be {{port}}-{{sandbox id}}.{}",
                            std::string(domain), std::string(domain))));
  }
  auto port = ParsePortNumber(label.substr(0, dash));
  if (!port.ok()) return absl::StatusOr<PortAddress>(port.status());
  PortAddress a;
  // Host names are case-insensitive and ids lowercase: a browser may have lowered nothing, but
  // a client may have raised it.
  a.sandbox_id = std::string(label.substr(dash + 1));
  for (char& c : a.sandbox_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // "sbx-…", the form a DNS name and a wildcard certificate allow, is the id "sbx_…".
  if (a.sandbox_id.rfind("sbx-", 0) == 0) a.sandbox_id[3] = '_';
  a.port = *port;
  a.upstream_target = target.empty() || target[0] != '/' ? "/" : std::string(target);
  a.by_host = true;
  return absl::StatusOr<PortAddress>(std::move(a));
}

std::string UpstreamHead(const http::Request& req, const std::string& target,
                         const UpstreamHeadOptions& o) {
  std::string head;
  head.reserve(512);
  head += std::string_view(req.method_string().data(), req.method_string().size());
  head += ' ';
  head += target;
  head += " HTTP/1.1\r\n";
  for (const auto& f : req) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    if (HopByHop(name) ||
        (!o.keep_credentials &&
         (IEquals(name, kTrafficTokenHeader) || IEquals(name, kE2bTrafficTokenHeader))) ||
        IEquals(name, "x-forwarded-for") ||
        (!o.request_id.empty() && IEquals(name, "x-request-id")) ||
        IEquals(name, "x-forwarded-proto") ||
        (o.strip_authorization && IEquals(name, "authorization")) ||
        (o.strip_access_token && IEquals(name, "x-access-token"))) {
      continue;
    }
    head += name;
    head += ": ";
    head += std::string_view(f.value().data(), f.value().size());
    head += "\r\n";
  }
  if (!o.forwarded_for.empty()) head += fmt::format("X-Forwarded-For: {}\r\n", o.forwarded_for);
  if (!o.request_id.empty()) head += fmt::format("X-Request-Id: {}\r\n", o.request_id);
  if (!o.forwarded_proto.empty()) {
    head += fmt::format("X-Forwarded-Proto: {}\r\n", o.forwarded_proto);
  }
  if (o.upgrade) {
    auto up = req.find(http::bhttp::field::upgrade);
    head += "Connection: Upgrade\r\nUpgrade: ";
    if (up != req.end()) head += std::string_view(up->value().data(), up->value().size());
    head += "\r\n";
  }
  // Else nothing: HTTP/1.1's default is a connection kept alive (api/upstream_pool.h).
  if (o.has_body) {
    head += o.content_length ? fmt::format("Content-Length: {}\r\n", *o.content_length)
                             : std::string("Transfer-Encoding: chunked\r\n");
  }
  head += "\r\n";
  return head;
}

bool PassResponseHeader(std::string_view name) { return !HopByHop(name); }

}  // namespace sbx::api
