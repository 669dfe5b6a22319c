#include "http/framing.h"

#include <fmt/format.h>

#include <vector>

namespace sbx::http {
namespace {

namespace bhttp = boost::beast::http;

std::string_view Sv(boost::beast::string_view s) { return std::string_view(s.data(), s.size()); }

FramingError Bad(std::string message) {
  return FramingError{bhttp::status::bad_request, std::move(message)};
}

// RFC 9110 §5.6.2 tchar.
bool IsTchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTchar(c)) return false;
  }
  return true;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
  }
  return true;
}

// For messages: a client's bytes, bounded and with anything unprintable escaped.
std::string Shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

}  // namespace

size_t HeaderBlockEnd(std::string_view data, size_t from) {
  const size_t start = from > 3 ? from - 3 : 0;
  const size_t pos = data.find("\r\n\r\n", start);
  return pos == std::string_view::npos ? std::string_view::npos : pos + 4;
}

std::optional<FramingError> CheckHeaderBlock(std::string_view block) {
  // The final CRLFCRLF ends the last field line and is the empty line; lines start after
  // every LF before it.
  const size_t n = block.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = block[i];
    if (c == '\0') return Bad("NUL byte in the request header");
    if (c == '\r' && (i + 1 >= n || block[i + 1] != '\n')) {
      return Bad("CR not followed by LF in the request header");
    }
    if (c == '\n') {
      if (i == 0 || block[i - 1] != '\r') return Bad("bare LF in the request header");
      // The line that starts here. The last one (i == n - 3's successor) is the empty line.
      if (i + 1 < n - 2 && (block[i + 1] == ' ' || block[i + 1] == '\t')) {
        return Bad(
            "a header line starts with whitespace (obsolete line folding, RFC 9112 §5.2, is "
            "not accepted)");
      }
    }
  }
  return std::nullopt;
}

std::optional<FramingError> CheckFraming(const bhttp::request_header<>& h) {
  const unsigned version = h.version();
  if (version != 10 && version != 11) {
    return FramingError{bhttp::status::http_version_not_supported,
                        fmt::format("HTTP/{}.{} is not supported (HTTP/1.1 and 1.0 are)",
                                    version / 10, version % 10)};
  }

  size_t hosts = 0, lengths = 0;
  std::vector<std::string_view> te_fields;
  for (const auto& f : h) {
    switch (f.name()) {
      case bhttp::field::host:
        ++hosts;
        break;
      case bhttp::field::content_length:
        ++lengths;
        // Beast takes "5, 5" as 5; a proxy may take the first or the last element.
        if (Sv(f.value()).find(',') != std::string_view::npos) {
          return Bad("Content-Length must be a single number, not a list");
        }
        break;
      case bhttp::field::transfer_encoding:
        te_fields.push_back(Sv(f.value()));
        break;
      default:
        break;
    }
  }
  if (hosts > 1) return Bad("more than one Host header");
  if (hosts == 0 && version == 11) return Bad("an HTTP/1.1 request must have a Host header");
  if (lengths > 1) return Bad("more than one Content-Length header");
  if (te_fields.empty()) return std::nullopt;

  if (version == 10) {
    return Bad("Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1: its framing is faulty)");
  }
  if (lengths > 0) return Bad("both Transfer-Encoding and Content-Length");

  // The codings of every Transfer-Encoding field, in order (fields combine as one list).
  std::vector<std::string_view> codings;
  for (std::string_view field : te_fields) {
    size_t start = 0;
    for (;;) {
      const size_t comma = field.find(',', start);
      std::string_view item = TrimOws(field.substr(start, comma == std::string_view::npos
                                                              ? std::string_view::npos
                                                              : comma - start));
      if (item.empty()) return Bad("empty element in Transfer-Encoding");
      codings.push_back(item);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
  }
  for (std::string_view c : codings) {
    // A coding with parameters ("gzip;q=1") is still a coding; anything else is not one.
    const std::string_view name = TrimOws(c.substr(0, c.find(';')));
    if (!IsToken(name)) {
      return Bad(fmt::format("malformed Transfer-Encoding element '{}'", Shown(c)));
    }
  }
  if (!IEquals(codings.back(), "chunked")) {
    return Bad(fmt::format(
        "the final transfer coding is '{}', not chunked: the body length cannot be determined "
        "(RFC 9112 §6.3)",
        Shown(codings.back())));
  }
  for (size_t i = 0; i + 1 < codings.size(); ++i) {
    if (IEquals(TrimOws(codings[i].substr(0, codings[i].find(';'))), "chunked")) {
      return Bad("chunked is applied more than once in Transfer-Encoding");
    }
  }
  if (codings.size() > 1) {
    return FramingError{bhttp::status::not_implemented,
                        fmt::format("transfer coding '{}' is not supported (only chunked is)",
                                    Shown(codings.front()))};
  }
  return std::nullopt;
}

}  // namespace sbx::http
