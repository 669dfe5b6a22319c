#include "common/ids.h"

#include <openssl/rand.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/base64.h"

namespace sbx {
namespace {
constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyz234567";
constexpr size_t kIdChars = 20;

void RandomBytes(unsigned char* buf, size_t n) {
  if (RAND_bytes(buf, static_cast<int>(n)) != 1) {
    // The only failure mode is an unseeded RNG, which cannot happen on Linux with getrandom(2).
    std::abort();
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
