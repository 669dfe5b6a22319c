#include "net/peek.h"

#include <algorithm>
#include <cstdint>

#include "net/egress_rules.h"

namespace sbx::net {
namespace {

PeekResult NoName(PeekKind kind, const char* why) {
  PeekResult r;
  r.state = PeekState::kNoName;
  r.kind = kind;
  r.why = why;
  return r;
}

PeekResult NeedMore(PeekKind kind) {
  PeekResult r;
  r.kind = kind;
  return r;
}

PeekResult Named(PeekKind kind, std::string name) {
  PeekResult r;
  r.state = PeekState::kName;
  r.kind = kind;
  r.name = std::move(name);
  return r;
}

// A bounds-checked reader over one buffer: every read fails (ok() false) past the end.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool ok() const { return ok_; }
  size_t left() const { return b_.size() - pos_; }
  uint32_t U8() { return Take(1); }
  uint32_t U16() { return Take(2); }
  uint32_t U24() { return Take(3); }
  std::string_view Bytes(size_t n) {
    if (!ok_ || n > left()) {
      ok_ = false;
      return {};
    }
    std::string_view v = b_.substr(pos_, n);
    pos_ += n;
    return v;
  }

 private:
  uint32_t Take(size_t n) {
    if (!ok_ || n > left()) {
      ok_ = false;
      return 0;
    }
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(b_[pos_ + i]);
    pos_ += n;
    return v;
  }
  std::string_view b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

constexpr uint8_t kRecordHandshake = 0x16;
constexpr uint8_t kHandshakeClientHello = 0x01;
constexpr size_t kRecordHeader = 5;
constexpr size_t kMaxRecord = 16384;  // RFC 8446 5.1: a plaintext fragment's bound
constexpr uint16_t kExtServerName = 0x0000;
constexpr uint16_t kExtEncryptedClientHello = 0xfe0d;  // draft-ietf-tls-esni (ECH)
constexpr uint16_t kExtEncryptedServerName = 0xffce;   // the older ESNI drafts

// The ClientHello's body (after the 4-byte handshake header) -> its one host_name.
PeekResult ParseClientHello(std::string_view body) {
  constexpr PeekKind k = PeekKind::kTls;
  Reader r(body);
  r.U16();        // legacy_version
  r.Bytes(32);    // random
  size_t sid = r.U8();
  if (sid > 32) return NoName(k, "tls: session_id longer than 32");
  r.Bytes(sid);
  size_t suites = r.U16();
  if (suites < 2 || suites % 2 != 0) return NoName(k, "tls: bad cipher_suites");
  r.Bytes(suites);
  size_t comp = r.U8();
  if (comp < 1) return NoName(k, "tls: no compression_methods");
  r.Bytes(comp);
  if (!r.ok()) return NoName(k, "tls: truncated ClientHello");
  if (r.left() == 0) return NoName(k, "tls: no extensions (no server_name)");
  size_t ext_len = r.U16();
  if (!r.ok() || ext_len != r.left()) return NoName(k, "tls: extensions length mismatch");
  std::string name;
  bool seen_sni = false;
  while (r.left() > 0) {
    uint16_t type = static_cast<uint16_t>(r.U16());
    size_t len = r.U16();
    std::string_view data = r.Bytes(len);
    if (!r.ok()) return NoName(k, "tls: truncated extension");
    if (type == kExtEncryptedClientHello || type == kExtEncryptedServerName) {
      // The server would route by the inner, encrypted name.
      return NoName(k, "tls: encrypted client hello");
    }
    if (type != kExtServerName) continue;  // GREASE and every other extension
    if (seen_sni) return NoName(k, "tls: two server_name extensions");
    seen_sni = true;
    Reader s(data);
    size_t list_len = s.U16();
    if (!s.ok() || list_len != s.left()) return NoName(k, "tls: server_name list length");
    int host_names = 0;
    while (s.left() > 0) {
      uint8_t name_type = static_cast<uint8_t>(s.U8());
      size_t n = s.U16();
      std::string_view v = s.Bytes(n);
      if (!s.ok()) return NoName(k, "tls: truncated server_name");
      if (name_type != 0) return NoName(k, "tls: unknown server_name type");
      ++host_names;
      name = NormalizeHostName(v);
    }
    if (host_names != 1) return NoName(k, "tls: not exactly one host_name");
    if (name.empty()) return NoName(k, "tls: server_name is not a host name");
  }
  if (!seen_sni) return NoName(k, "tls: no server_name");
  return Named(k, std::move(name));
}

bool IsTchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// "host", "host:port" -> the normalized host; empty when it is not one (IPv6 literals,
// userinfo, a port that is not 1-5 digits).
std::string HostOfAuthority(std::string_view a) {
  if (a.find('@') != std::string_view::npos) return "";
  size_t colon = a.rfind(':');
  if (colon != std::string_view::npos) {
    std::string_view port = a.substr(colon + 1);
    if (port.empty() || port.size() > 5) return "";
    for (char c : port) {
      if (c < '0' || c > '9') return "";
    }
    a = a.substr(0, colon);
  }
  return NormalizeHostName(a);
}

constexpr size_t kMaxMethod = 24;

}  // namespace

std::string NormalizeHostName(std::string_view host) { return NormalizeName(host); }

PeekResult PeekTlsClientHello(std::string_view all) {
  constexpr PeekKind k = PeekKind::kTls;
  // Only the first kPeekLimit bytes count (the proxy reads no more), so a decision depends on
  // them alone.
  const std::string_view bytes = all.substr(0, kPeekLimit);
  // Reassemble the handshake layer from as many records as the ClientHello spans.
  std::string hs;
  size_t pos = 0;
  while (true) {
    if (!hs.empty() && static_cast<uint8_t>(hs[0]) != kHandshakeClientHello) {
      return NoName(k, "tls: first handshake message is not a ClientHello");
    }
    if (hs.size() >= 4) {
      size_t need = 4 + ((static_cast<uint8_t>(hs[1]) << 16) | (static_cast<uint8_t>(hs[2]) << 8) |
                         static_cast<uint8_t>(hs[3]));
      if (need > kPeekLimit) return NoName(k, "tls: ClientHello larger than the peek limit");
      if (hs.size() >= need) return ParseClientHello(std::string_view(hs).substr(4, need - 4));
    }
    if (pos == bytes.size()) break;
    std::string_view header = bytes.substr(pos, kRecordHeader);
    if (static_cast<uint8_t>(header[0]) != kRecordHandshake) {
      return NoName(k, pos == 0 ? "tls: not a handshake record" : "tls: record before the ClientHello ends");
    }
    if (header.size() >= 2 && static_cast<uint8_t>(header[1]) != 0x03) return NoName(k, "tls: record version");
    if (header.size() < kRecordHeader) break;
    Reader h(header);
    h.U8();
    h.U16();
    size_t len = h.U16();
    if (len == 0 || len > kMaxRecord) return NoName(k, "tls: record length");
    size_t avail = std::min(len, bytes.size() - pos - kRecordHeader);
    hs.append(bytes.substr(pos + kRecordHeader, avail));
    pos += kRecordHeader + avail;
  }
  if (all.size() >= kPeekLimit) return NoName(k, "tls: ClientHello larger than the peek limit");
  return NeedMore(k);
}

PeekResult PeekHttpHost(std::string_view bytes) {
  constexpr PeekKind k = PeekKind::kHttp;
  // The method: a token of capital letters in practice; anything else is not HTTP/1.x.
  size_t sp = bytes.find(' ');
  size_t method_end = sp == std::string_view::npos ? bytes.size() : sp;
  if (method_end > kMaxMethod) return NoName(k, "http: no request line");
  for (size_t i = 0; i < method_end; ++i) {
    if (!IsTchar(bytes[i])) return NoName(k, "http: no request line");
  }
  if (sp == 0) return NoName(k, "http: no request line");
  size_t end = bytes.find("\r\n\r\n");
  if (end == std::string_view::npos) {
    if (bytes.size() >= kPeekLimit) return NoName(k, "http: header block larger than the peek limit");
    return NeedMore(k);
  }
  if (end + 4 > kPeekLimit) return NoName(k, "http: header block larger than the peek limit");
  std::string_view block = bytes.substr(0, end + 2);  // every line ends with CRLF
  size_t eol = block.find("\r\n");
  std::string_view line = block.substr(0, eol);
  std::string_view method = line.substr(0, sp);
  size_t sp2 = line.find(' ', sp + 1);
  if (sp2 == std::string_view::npos) return NoName(k, "http: bad request line");
  std::string_view target = line.substr(sp + 1, sp2 - sp - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return NoName(k, "http: not HTTP/1.x");
  if (target.empty()) return NoName(k, "http: bad request line");
  for (char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return NoName(k, "http: bad request line");
  }
  if (method == "CONNECT") return NoName(k, "http: CONNECT");
  std::string target_host;
  bool absolute = false;
  size_t scheme_end = target.find("://");
  if (target.front() != '/' && target != "*") {
    if (scheme_end == std::string_view::npos) return NoName(k, "http: bad request target");
    std::string_view scheme = target.substr(0, scheme_end);
    if (!EqualsIgnoreCase(scheme, "http") && !EqualsIgnoreCase(scheme, "https")) {
      return NoName(k, "http: bad request target");
    }
    std::string_view rest = target.substr(scheme_end + 3);
    std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
    target_host = HostOfAuthority(authority);
    if (target_host.empty()) return NoName(k, "http: bad authority in the request target");
    absolute = true;
  }
  std::string host;
  int hosts = 0;
  size_t pos = eol + 2;
  while (pos < block.size()) {
    size_t next = block.find("\r\n", pos);
    std::string_view h = block.substr(pos, next - pos);
    pos = next + 2;
    if (h.find('\n') != std::string_view::npos || h.find('\r') != std::string_view::npos) {
      return NoName(k, "http: bare CR or LF");
    }
    if (h.front() == ' ' || h.front() == '\t') return NoName(k, "http: obs-fold");
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return NoName(k, "http: bad header line");
    std::string_view field = h.substr(0, colon);
    for (char c : field) {
      if (!IsTchar(c)) return NoName(k, "http: bad header name");
    }
    if (!EqualsIgnoreCase(field, "host")) continue;
    std::string_view v = h.substr(colon + 1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    ++hosts;
    host = HostOfAuthority(v);
    if (host.empty()) return NoName(k, "http: Host is not a host name");
  }
  if (hosts > 1) return NoName(k, "http: more than one Host");
  if (absolute) {
    if (hosts == 1 && host != target_host) return NoName(k, "http: Host differs from the request target");
    return Named(k, std::move(target_host));
  }
  if (hosts == 0) return NoName(k, "http: no Host");
  return Named(k, std::move(host));
}

PeekResult PeekName(std::string_view bytes) {
  if (bytes.empty()) return NeedMore(PeekKind::kUnknown);
  if (static_cast<uint8_t>(bytes[0]) == kRecordHandshake) return PeekTlsClientHello(bytes);
  return PeekHttpHost(bytes);
}

}  // namespace sbx::net
