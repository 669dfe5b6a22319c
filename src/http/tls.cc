#include "http/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fmt/format.h>

#include "common/files.h"
#include "common/status_util.h"

namespace sbx::http {
namespace {

namespace ssl = boost::asio::ssl;

// OpenSSL's reasons, oldest first, off its per-thread queue (which is emptied): the error code
// Asio hands back carries only the last one, often a generic "PEM lib".
std::string OpenSslReasons(const boost::system::error_code& ec) {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    if (reason == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += reason;
  }
  return out.empty() ? ec.message() : out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ssl::context>> LoadServerTls(const std::string& cert_file,
                                                            const std::string& key_file) {
  // Read here rather than by OpenSSL: a missing or unreadable file is then named with errno
  // ("No such file or directory"), not as OpenSSL's "system lib".
  SBX_ASSIGN_OR_RETURN(const std::string cert_pem, ReadFileToString(cert_file));
  SBX_ASSIGN_OR_RETURN(const std::string key_pem, ReadFileToString(key_file));
  ERR_clear_error();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                       ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                   ec);
  if (!ec && SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION) != 1) {
    return absl::InternalError(fmt::format("TLS: SSL_CTX_set_min_proto_version(TLS 1.2): {}",
                                           OpenSslReasons(ec)));
  }
  if (ec) return absl::InternalError(fmt::format("TLS: set_options: {}", OpenSslReasons(ec)));
  ctx->use_certificate_chain(boost::asio::buffer(cert_pem), ec);
  if (ec) {
    return absl::InvalidArgumentError(fmt::format(
        "TLS certificate {}: not a PEM certificate chain: {}", cert_file, OpenSslReasons(ec)));
  }
  ctx->use_private_key(boost::asio::buffer(key_pem), ssl::context::pem, ec);
  const auto code = static_cast<unsigned long>(ec.value());
  if (ec && ERR_GET_LIB(code) == ERR_LIB_X509 &&
      ERR_GET_REASON(code) == X509_R_KEY_VALUES_MISMATCH) {
    // OpenSSL checks the key against the certificate as it takes it.
    return absl::InvalidArgumentError(
        fmt::format("TLS key {} does not belong to the certificate of {}: {}", key_file,
                    cert_file, OpenSslReasons(ec)));
  }
  if (ec) {
    return absl::InvalidArgumentError(fmt::format("TLS key {}: not a PEM private key: {}",
                                                  key_file, OpenSslReasons(ec)));
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    return absl::InvalidArgumentError(
        fmt::format("TLS key {} does not belong to the certificate of {}: {}", key_file,
                    cert_file, OpenSslReasons(ec)));
  }
  return ctx;
}

std::string DescribeServerTls(ssl::context& context) {
  X509* leaf = SSL_CTX_get0_certificate(context.native_handle());
  if (leaf == nullptr) return "no certificate";
  std::string subject = "?";
  if (char* s = X509_NAME_oneline(X509_get_subject_name(leaf), nullptr, 0)) {
    subject = s;
    OPENSSL_free(s);
  }
  std::string not_after = "?";
  if (BIO* bio = BIO_new(BIO_s_mem())) {
    if (ASN1_TIME_print(bio, X509_get0_notAfter(leaf)) == 1) {
      char* data = nullptr;
      const long n = BIO_get_mem_data(bio, &data);
      if (n > 0) not_after.assign(data, static_cast<size_t>(n));
    }
    BIO_free(bio);
  }
  return fmt::format("subject {}, valid until {}", subject, not_after);
}

}  // namespace sbx::http
