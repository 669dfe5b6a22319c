// Digests and secret comparison, on OpenSSL (which the static sbx-agent does not link).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx {

// Lowercase hex SHA-256 of `in`.
std::string Sha256Hex(std::string_view in);

// "sha256:<hex>", the OCI digest form of SHA-256(in).
std::string Sha256Digest(std::string_view in);

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
// The digest ("sha256:<hex>") and size of the whole file `fd` (read from offset 0 with pread,
// so the fd's offset stays), checking `stop` between 1 MiB reads (Cancelled when it says so).
struct FileDigest {
  std::string digest;
  uint64_t size = 0;
};
absl::StatusOr<FileDigest> Sha256OfFile(int fd, const std::function<bool()>& stop = {});

// Raw HMAC-SHA256(key, msg).
std::string HmacSha256(std::string_view key, std::string_view msg);
// Constant-time comparison for secrets.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sbx
