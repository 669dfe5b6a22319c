// A byte stream that is TCP, or TLS over TCP, chosen per connection at run time: sbxd's
// listener speaks one or the other (tls.cert_file), the CLI follows the URL's scheme. Code
// written once against this type serves both: it is an Asio AsyncStream and SyncStream, so
// Beast's HTTP and WebSocket operations and asio::async_write take it as they take a
// beast::tcp_stream, and a completion handler goes to the one stream underneath unchanged (its
// cancellation slot and executor included): no type erasure, no allocation per operation.
//
// Header-only on purpose: sbx-agent compiles sbx_common's sources into its static binary and
// links no OpenSSL::SSL; the targets that include this link it.
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket/teardown.hpp>

namespace sbx {

class MaybeTlsStream {
 public:
  using Plain = boost::beast::tcp_stream;
  using Tls = boost::beast::ssl_stream<boost::beast::tcp_stream>;
  using executor_type = Plain::executor_type;

  explicit MaybeTlsStream(Plain plain) : v_(std::in_place_type<Plain>, std::move(plain)) {}
  explicit MaybeTlsStream(boost::asio::ip::tcp::socket socket)
      : v_(std::in_place_type<Plain>, std::move(socket)) {}
  // For an owning websocket::stream<MaybeTlsStream>, built from an io_context.
  explicit MaybeTlsStream(boost::asio::io_context& ioc) : v_(std::in_place_type<Plain>, ioc) {}
  MaybeTlsStream(MaybeTlsStream&&) = default;
  MaybeTlsStream& operator=(MaybeTlsStream&&) = default;

  // Puts TLS over the TCP connection (before its handshake, which the caller runs through
  // tls()). The context is kept for as long as the stream: a server that swaps its context
  // (a certificate reload) leaves this connection the one it began with.
  void StartTls(std::shared_ptr<boost::asio::ssl::context> context) {
    context_ = std::move(context);
    Plain plain = std::move(std::get<Plain>(v_));
    v_.emplace<Tls>(std::move(plain), *context_);
  }

  bool is_tls() const { return std::holds_alternative<Tls>(v_); }
  Tls* tls() { return std::get_if<Tls>(&v_); }
  // The TCP connection underneath: its timeouts (expires_after), its socket, its endpoints.
  Plain& tcp() {
    if (Tls* t = tls()) return t->next_layer();
    return std::get<Plain>(v_);
  }

  executor_type get_executor() noexcept {
    return std::visit([](auto& s) { return s.get_executor(); }, v_);
  }

  template <class MutableBufferSequence, class Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const MutableBufferSequence& b) {
          std::visit([&](auto& s) { s.async_read_some(b, std::move(handler)); }, v_);
        },
        token, buffers);
  }
  template <class ConstBufferSequence, class Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const ConstBufferSequence& b) {
          std::visit([&](auto& s) { s.async_write_some(b, std::move(handler)); }, v_);
        },
        token, buffers);
  }

  template <class MutableBufferSequence>
  std::size_t read_some(const MutableBufferSequence& b, boost::system::error_code& ec) {
    return std::visit([&](auto& s) { return s.read_some(b, ec); }, v_);
  }
  template <class MutableBufferSequence>
  std::size_t read_some(const MutableBufferSequence& b) {
    boost::system::error_code ec;
    const std::size_t n = read_some(b, ec);
    if (ec) boost::throw_exception(boost::system::system_error(ec));
    return n;
  }
  template <class ConstBufferSequence>
  std::size_t write_some(const ConstBufferSequence& b, boost::system::error_code& ec) {
    return std::visit([&](auto& s) { return s.write_some(b, ec); }, v_);
  }
  template <class ConstBufferSequence>
  std::size_t write_some(const ConstBufferSequence& b) {
    boost::system::error_code ec;
    const std::size_t n = write_some(b, ec);
    if (ec) boost::throw_exception(boost::system::system_error(ec));
    return n;
  }

  // Beast closes a stream with this when a WebSocket operation times out or fails: the TCP
  // connection underneath, with whatever TLS is over it.
  friend void beast_close_socket(MaybeTlsStream& s) { boost::beast::close_socket(s.tcp()); }

  // A WebSocket's closing handshake ends with these (found by Beast through ADL): over TLS
  // they send close_notify before the TCP connection closes.
  friend void teardown(boost::beast::role_type role, MaybeTlsStream& s,
                       boost::system::error_code& ec) {
    std::visit(
        [&](auto& x) {
          using boost::beast::websocket::teardown;
          teardown(role, x, ec);
        },
        s.v_);
  }
  template <class TeardownHandler>
  friend void async_teardown(boost::beast::role_type role, MaybeTlsStream& s,
                             TeardownHandler&& handler) {
    std::visit(
        [&](auto& x) {
          using boost::beast::websocket::async_teardown;
          async_teardown(role, x, std::move(handler));
        },
        s.v_);
  }

 private:
  // Before v_: an ssl_stream must not outlive the context it was made from.
  std::shared_ptr<boost::asio::ssl::context> context_;
  std::variant<Plain, Tls> v_;
};

// Why a TLS operation failed, for a message: OpenSSL's reason, and for a certificate that was
// not accepted the verifier's own words ("unable to get local issuer certificate", "hostname
// mismatch"), which the error code alone does not carry.
inline std::string TlsErrorText(const boost::system::error_code& ec, MaybeTlsStream::Tls* tls) {
  std::string out = ec.message();
  if (tls != nullptr) {
    const long verify = SSL_get_verify_result(tls->native_handle());
    if (verify != X509_V_OK) {
      out += ": ";
      out += X509_verify_cert_error_string(verify);
    }
  }
  return out;
}

}  // namespace sbx
