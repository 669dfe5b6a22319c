#include "common/ids.h"

#include <sys/mman.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
// Random bytes for ids, drawn from the kernel a few hundred at a time: one getrandom(2) per
// request was one of the six syscalls of sbxd's cheapest request (issue 15's HTTP floor). The
// bytes wait in a page of their own per thread that the kernel zeroes in a child after a fork
// or a clone (MADV_WIPEONFORK, Linux 4.14), count included: a child never hands out the ids its
// parent will. Bytes handed out are zeroed. Where the page cannot be had, each id asks the
// kernel, as before.
class IdBytes {
 public:
  ~IdBytes() {
    if (page_ != nullptr) ::munmap(page_, kPage);
  }
  void Take(unsigned char* out, size_t n) {
    if (page_ == nullptr && !Map()) {
      RandomBytes(out, n);
      return;
    }
    if (page_->left < n) {
      RandomBytes(page_->bytes, sizeof(page_->bytes));
      page_->left = sizeof(page_->bytes);
    }
    unsigned char* from = page_->bytes + sizeof(page_->bytes) - page_->left;
    std::memcpy(out, from, n);
    std::memset(from, 0, n);
    page_->left -= n;
  }

 private:
  static constexpr size_t kPage = 4096;
  struct Page {
    size_t left;
    unsigned char bytes[240];  // 12 ids; at most 256 bytes keeps getrandom(2) whole
  };
  bool Map() {
    if (failed_) return false;
    void* p = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      failed_ = true;
      return false;
    }
    if (::madvise(p, kPage, MADV_WIPEONFORK) != 0) {
      ::munmap(p, kPage);
      failed_ = true;
      return false;
    }
    page_ = static_cast<Page*>(p);  // zero-filled: left == 0
    return true;
  }
  Page* page_ = nullptr;
  bool failed_ = false;
};

thread_local IdBytes id_bytes;

}  // namespace

std::string NewId(std::string_view prefix) {
  unsigned char raw[kIdChars];
  id_bytes.Take(raw, sizeof(raw));
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
