// The CLI's side of TLS to sbxd (SBX_URL https://…): sbxd's certificate is verified against
// --cacert / SBX_CACERT, or the system's CAs, and must name the URL's host (a DNS name or an
// IP address in its subjectAltName). Every connection the CLI opens (requests, attach streams,
// file transfers, WebSocket sessions) goes through these.
#pragma once

#include <string>

#include <boost/system/error_code.hpp>

#include "absl/status/status.h"
#include "cli/client.h"
#include "common/tls_stream.h"

namespace sbx::cli {

// For an https endpoint: its TLS context (TLS 1.2 at least, peer verification on) in ep.tls.
// `ca_file`: a PEM bundle of the CAs to trust instead of the system's. Nothing for http.
absl::Status SetUpTls(Endpoint& ep, const std::string& ca_file);

// Puts TLS over `stream`, whose TCP connection to ep is open, and readies its handshake: the
// server name (SNI) and the name the certificate must carry.
absl::Status PrepareTls(MaybeTlsStream& stream, const Endpoint& ep);

// A failed handshake as the user should read it: why the certificate was refused, and what to
// do about an unknown CA.
absl::Status TlsHandshakeError(const boost::system::error_code& ec, MaybeTlsStream& stream,
                               const Endpoint& ep);

}  // namespace sbx::cli
