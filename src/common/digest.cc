#include "common/digest.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "common/status_util.h"

namespace sbx {
namespace {

// OpenSSL 3 looks an algorithm up by name (a lock and string compares in its method store) on
// every implicit use such as SHA256() or EVP_sha256(); fetched once, the lookup is paid once.
// Every request pays at least one digest (its token's), a command or a create a few more.
const EVP_MD* Sha256Md() {
  static const EVP_MD* const md = [] {
    const EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return m != nullptr ? m : EVP_sha256();
  }();
  return md;
}

}  // namespace

std::string Sha256Hex(std::string_view in) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(in.data(), in.size(), md, &len, Sha256Md(), nullptr) != 1 ||
      len != SHA256_DIGEST_LENGTH) {
    std::abort();  // only on allocation failure: no digest is not a value a caller can use
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::string Sha256Digest(std::string_view in) { return "sha256:" + Sha256Hex(in); }

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), Sha256Md(), nullptr);
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256Stream::Update(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
}

std::string Sha256Stream::Digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

absl::StatusOr<FileDigest> Sha256OfFile(int fd, const std::function<bool()>& stop) {
  Sha256Stream hash;
  std::vector<char> buf(1 << 20);
  FileDigest out;
  for (;;) {
    if (stop && stop()) return absl::CancelledError("sha256 of a file: cancelled");
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(out.size));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "sha256 of a file: pread");
    if (n == 0) break;
    hash.Update(buf.data(), static_cast<size_t>(n));
    out.size += static_cast<uint64_t>(n);
  }
  out.digest = hash.Digest();
  return out;
}

std::string HmacSha256(std::string_view key, std::string_view msg) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), md, &len);
  return std::string(reinterpret_cast<char*>(md), len);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace sbx
