// UniqueFd owns one file descriptor. Move-only; the destructor closes (errors ignored); callers
// who care about close errors call Close().
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <utility>

namespace sbx {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Returns the close(2) result (0 or -1 with errno set).
  int Close() {
    int r = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return r;
  }

 private:
  int fd_ = -1;
};

// Marks `fd` close-on-exec. For descriptors a library makes without it (asio opens and accepts
// sockets without SOCK_CLOEXEC): a program sbxd starts must not inherit its connections or its
// listening socket. False (errno set) on error.
inline bool SetCloseOnExec(int fd) { return ::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0; }

}  // namespace sbx
