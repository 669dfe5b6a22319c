#include "common/ids.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "common/base64.h"

namespace sbx {
namespace {
constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyz234567";
constexpr size_t kIdChars = 20;

// The kernel's CSPRNG directly: a third of RAND_bytes' cost here (no provider lookup, no
// locks), and nothing to reseed after a fork. Up to 256 bytes, getrandom(2) neither blocks
// (once the pool is initialized at boot) nor returns short; the loop is for longer secrets.
void RandomBytes(unsigned char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(buf + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      std::abort();  // ENOSYS (a kernel before 3.17) cannot run sbxd at all
    }
    got += static_cast<size_t>(r);
  }
}
}  // namespace

std::string NewId(std::string_view prefix) {
  unsigned char raw[kIdChars];
  RandomBytes(raw, sizeof(raw));
  std::string id(prefix);
  id.push_back('_');
  for (unsigned char c : raw) id.push_back(kAlphabet[c & 31]);
  return id;
}

bool IsValidId(std::string_view id, std::string_view prefix) {
  if (id.size() != prefix.size() + 1 + kIdChars) return false;
  if (id.substr(0, prefix.size()) != prefix || id[prefix.size()] != '_') return false;
  for (char c : id.substr(prefix.size() + 1)) {
    if (kAlphabet.find(c) == std::string_view::npos) return false;
  }
  return true;
}

std::string NewSecret(size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  RandomBytes(raw.data(), raw.size());
  return Base64UrlEncode(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
}

}  // namespace sbx
