// Digests and secret comparison, on OpenSSL (which the static sbx-agent does not link).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sbx {

// Lowercase hex SHA-256 of `in`.
std::string Sha256Hex(std::string_view in);

// SHA-256 of a stream fed in pieces (image layers and blobs, docs/templates.md).
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t n);
  // "sha256:<64 lowercase hex>" of what was fed; the stream is spent.
  std::string Digest();

 private:
  void* ctx_;  // EVP_MD_CTX, kept out of this header
};
// Raw HMAC-SHA256(key, msg).
std::string HmacSha256(std::string_view key, std::string_view msg);
// Constant-time comparison for secrets.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sbx
