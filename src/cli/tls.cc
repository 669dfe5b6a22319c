#include "cli/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <fmt/format.h>

#include <boost/asio/ip/address.hpp>

namespace sbx::cli {
namespace {

namespace ssl = boost::asio::ssl;

std::string OpenSslReason(const boost::system::error_code& ec) {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    if (const char* r = ERR_reason_error_string(e)) out = r;  // the last one is the cause
  }
  return out.empty() ? ec.message() : out;
}

}  // namespace

absl::Status SetUpTls(Endpoint& ep, const std::string& ca_file) {
  if (!ep.https()) return absl::OkStatus();
  ERR_clear_error();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  if (SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION) != 1) {
    return absl::InternalError("TLS: SSL_CTX_set_min_proto_version(TLS 1.2) failed");
  }
  boost::system::error_code ec;
  if (ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
    if (ec) {
      return absl::InternalError(
          fmt::format("TLS: the system's CA certificates: {}", OpenSslReason(ec)));
    }
  } else {
    ctx->load_verify_file(ca_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          fmt::format("--cacert / SBX_CACERT {}: not a readable PEM file of CA certificates: {}",
                      ca_file, OpenSslReason(ec)));
    }
  }
  ctx->set_verify_mode(ssl::verify_peer, ec);
  ep.tls = std::move(ctx);
  return absl::OkStatus();
}

absl::Status PrepareTls(MaybeTlsStream& stream, const Endpoint& ep) {
  if (ep.tls == nullptr) return absl::InternalError("TLS: no context for an https endpoint");
  stream.StartTls(ep.tls);
  SSL* ssl = stream.tls()->native_handle();
  boost::system::error_code ec;
  boost::asio::ip::make_address(ep.host, ec);
  const bool is_ip = !ec;
  // OpenSSL checks the name during the handshake, so that a mismatch fails it with
  // "hostname mismatch" rather than after it.
  const int set = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), ep.host.c_str())
                        : SSL_set1_host(ssl, ep.host.c_str());
  if (set != 1) {
    return absl::InvalidArgumentError(
        fmt::format("TLS: {} cannot be checked against a certificate", ep.host));
  }
  // SNI carries a name only, never an address (RFC 6066 §3).
  if (!is_ip && SSL_set_tlsext_host_name(ssl, ep.host.c_str()) != 1) {
    return absl::InternalError(fmt::format("TLS: SSL_set_tlsext_host_name({}) failed", ep.host));
  }
  return absl::OkStatus();
}

absl::Status TlsHandshakeError(const boost::system::error_code& ec, MaybeTlsStream& stream,
                               const Endpoint& ep) {
  std::string why = TlsErrorText(ec, stream.tls());
  const long verify = stream.tls() ? SSL_get_verify_result(stream.tls()->native_handle())
                                   : X509_V_OK;
  if (verify == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
      verify == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
      verify == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ||
      verify == X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE) {
    why += " (pass --cacert FILE or set SBX_CACERT to the CA that signed sbxd's certificate)";
  } else if (ec == boost::asio::ssl::error::stream_truncated || ec == boost::asio::error::eof ||
             (ec.category() == boost::asio::error::get_ssl_category() &&
              ERR_GET_REASON(static_cast<unsigned long>(ec.value())) ==
                  SSL_R_WRONG_VERSION_NUMBER)) {
    why += " (is sbxd at this address serving HTTPS?)";
  }
  return absl::UnavailableError(
      fmt::format("cannot reach sbxd at {}: TLS handshake failed: {}", ep.url, why));
}

}  // namespace sbx::cli
