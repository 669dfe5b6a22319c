#include "daemon/state_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::daemon {

absl::Status EnsureStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), fmt::format("state dir: mkdir({})", dir));
  if (::chmod(dir.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, fmt::format("state dir: chmod({})", dir));
  }
  return absl::OkStatus();
}

namespace {
absl::Status WriteSecret(const std::filesystem::path& path, const std::string& secret) {
  std::string tmp = path.string() + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return ErrnoStatus(errno, fmt::format("secret: open({})", tmp));
  std::string data = secret + "\n";
  if (::write(fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size()) ||
      ::fsync(fd.get()) != 0) {
    return ErrnoStatus(errno, fmt::format("secret: write({})", tmp));
  }
  fd.Close();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("secret: rename({})", path.string()));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::string> LoadOrCreateSecret(const std::filesystem::path& path,
                                               const std::string& given) {
  if (!given.empty()) {
    SBX_RETURN_IF_ERROR(WriteSecret(path, given));
    return given;
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd) {
    char buf[512];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) return ErrnoStatus(errno, fmt::format("secret: read({})", path.string()));
    std::string s(buf, static_cast<size_t>(n));
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    if (!s.empty()) return s;
  } else if (errno != ENOENT) {
    return ErrnoStatus(errno, fmt::format("secret: open({})", path.string()));
  }
  std::string secret = NewSecret(32);
  SBX_RETURN_IF_ERROR(WriteSecret(path, secret));
  return secret;
}

}  // namespace sbx::daemon
