// The name a sandbox's TCP connection asks for, read from its first bytes without terminating
// anything: a TLS ClientHello's server_name (SNI), or a plain HTTP/1.x request's Host. sbxd's
// connection proxy (conn_proxy.h) peeks these bytes and checks the name against the sandbox's
// domain rules and against what sbxd's resolver answered it.
//
// The bytes come from untrusted code, so the parsers are strict: whenever a server could read
// a different name than the one returned here, the answer is kNoName and the connection is
// refused. In particular:
//   - TLS: the ClientHello may span several handshake records (each is reassembled); exactly
//     one server_name extension with exactly one host_name; a ClientHello offering Encrypted
//     Client Hello (or the older ESNI draft) is refused, because the server would route by the
//     encrypted inner name we cannot read (documented in docs/threat-model.md).
//   - HTTP: exactly one Host header, or the authority of an absolute-form request target (and
//     then a Host, if present, must name the same host); no obs-fold, no space before a
//     header's colon; CONNECT and HTTP/2's preface are refused (no name we can hold).
// Names are returned as NormalizeName (egress_rules.h) keeps them, without a port; anything
// else (an IP literal, an escape) is kNoName: a domain rule never matches an address.
//
// Only the first request of a connection is looked at: a later request on a kept-alive
// connection, or a TLS session's inner Host header, is not (domain fronting; threat model).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sbx::net {

enum class PeekState {
  kNeedMore,  // a prefix of something that may still name a host: read more
  kName,      // `name` is the host asked for
  kNoName,    // no readable name: refuse (why: `why`)
};

enum class PeekKind { kUnknown, kTls, kHttp };

struct PeekResult {
  PeekState state = PeekState::kNeedMore;
  PeekKind kind = PeekKind::kUnknown;
  std::string name;
  const char* why = "";  // for kNoName: a short reason for the log
};

// The largest prefix the proxy reads before it decides; a ClientHello or header block longer
// than this is kNoName (PeekName answers kNoName itself when `bytes` reaches it).
inline constexpr size_t kPeekLimit = 16 * 1024;

// Looks at the bytes a client has sent so far (all of them, from the first). Deterministic:
// more bytes never turn kName/kNoName into something else.
PeekResult PeekName(std::string_view bytes);

// Each parser on its own (PeekName picks by the first byte).
PeekResult PeekTlsClientHello(std::string_view bytes);
PeekResult PeekHttpHost(std::string_view bytes);

// NormalizeName (egress_rules.h): lowercase, one trailing dot dropped, labels of 1-63 of
// [a-z0-9-_], at most 253 bytes, not an IPv4 literal. Empty string when it is not a name.
std::string NormalizeHostName(std::string_view host);

}  // namespace sbx::net
