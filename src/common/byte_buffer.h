// A growable byte buffer that leaves what it grows into uninitialised, where std::string's
// resize() zeroes it: for bytes written right after room is made for them (the base64 of
// process output in the attach stream, 4/3 of every byte a busy session prints). Keeps its
// capacity across clear(), so a buffer reused batch after batch allocates nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string_view>

namespace sbx {

class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(ByteBuffer&&) noexcept = default;
  ByteBuffer& operator=(ByteBuffer&&) noexcept = default;

  const char* data() const { return buf_.get(); }
  char* data() { return buf_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {buf_.get(), size_}; }
  void clear() { size_ = 0; }

  void reserve(size_t n) {
    if (n > capacity_) Reallocate(n);
  }
  // n more bytes at the end, not initialised: the caller writes all of them.
  char* Extend(size_t n) {
    if (capacity_ - size_ < n) Reallocate(std::max(size_ + n, 2 * capacity_));
    char* at = buf_.get() + size_;
    size_ += n;
    return at;
  }
  // Drops the bytes from n on (n <= size()): what an Extend made room for and did not use.
  void Truncate(size_t n) { size_ = std::min(n, size_); }
  void append(std::string_view s) {
    if (!s.empty()) std::memcpy(Extend(s.size()), s.data(), s.size());
  }
  void push_back(char c) { *Extend(1) = c; }

 private:
  void Reallocate(size_t n) {
    auto grown = std::make_unique_for_overwrite<char[]>(n);
    if (size_ > 0) std::memcpy(grown.get(), buf_.get(), size_);
    buf_ = std::move(grown);
    capacity_ = n;
  }

  std::unique_ptr<char[]> buf_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace sbx
