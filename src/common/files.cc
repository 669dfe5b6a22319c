#include "common/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("read file: open({})", path));
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("read file: read({})", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string ReadFileOrEmpty(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  return text.ok() ? std::move(*text) : std::string();
}

absl::Status WriteFileContents(const std::string& path, std::string_view contents, mode_t mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) return ErrnoStatus(errno, fmt::format("write file: open({})", path));
  while (!contents.empty()) {
    const ssize_t n = ::write(fd.get(), contents.data(), contents.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("write file: write({})", path));
    }
    contents.remove_prefix(static_cast<size_t>(n));
  }
  // close(2) reports what a network or full file system deferred.
  if (fd.Close() != 0) return ErrnoStatus(errno, fmt::format("write file: close({})", path));
  return absl::OkStatus();
}

}  // namespace sbx
