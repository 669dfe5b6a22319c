// The server side of TLS on sbxd's listener (docs/config.md, tls.*): the context every
// connection's handshake uses, loaded from PEM files at start-up and again on SIGHUP. A loaded
// context is never changed: a reload makes a new one and the server swaps its pointer, so a
// connection keeps the context (and certificate) it began with.
#pragma once

#include <memory>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "absl/status/statusor.h"

namespace sbx::http {

// TLS 1.2 at least, OpenSSL's default ciphers for the server, the chain of `cert_file` (the
// leaf first, then intermediates) and the private key of `key_file`, which must match the
// leaf. Errors name the file and OpenSSL's reason ("no start line", "key values mismatch").
absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> LoadServerTls(
    const std::string& cert_file, const std::string& key_file);

// What a certificate file holds, for the log: the leaf's subject and its notAfter.
std::string DescribeServerTls(boost::asio::ssl::context& context);

}  // namespace sbx::http
