#include "runtime/ns/agent_image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif

namespace sbx::runtime::ns {

absl::StatusOr<AgentImage> AgentImage::Load(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("agent binary: no path configured");
  UniqueFd src(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!src) return ErrnoStatus(errno, fmt::format("agent binary: open({})", path));
  struct stat st;
  if (::fstat(src.get(), &st) != 0) return ErrnoStatus(errno, fmt::format("agent binary: fstat({})", path));
  if (!S_ISREG(st.st_mode) || st.st_size < 4) {
    return absl::FailedPreconditionError(fmt::format("agent binary: {} is not a regular file", path));
  }
  char magic[4];
  if (::pread(src.get(), magic, 4, 0) != 4 || std::memcmp(magic, "\x7f" "ELF", 4) != 0) {
    return absl::FailedPreconditionError(
        fmt::format("agent binary: {} is not an ELF executable", path));
  }

  // Kernels with vm.memfd_noexec (6.3+) want MFD_EXEC said out loud; older ones reject the flag.
  const unsigned base = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  int raw = static_cast<int>(::syscall(SYS_memfd_create, "sbx-agent", base | MFD_EXEC));
  if (raw < 0 && errno == EINVAL) raw = static_cast<int>(::syscall(SYS_memfd_create, "sbx-agent", base));
  UniqueFd mfd(raw);
  if (!mfd) return ErrnoStatus(errno, "agent binary: memfd_create(sbx-agent)");

  off_t off = 0;
  size_t left = static_cast<size_t>(st.st_size);
  while (left > 0) {
    ssize_t n = ::sendfile(mfd.get(), src.get(), &off, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("agent binary: sendfile({} -> memfd)", path));
    }
    if (n == 0) break;
    left -= static_cast<size_t>(n);
  }
  if (left != 0) {
    return absl::DataLossError(fmt::format("agent binary: {} shrank while being read", path));
  }
  if (::fchmod(mfd.get(), 0555) != 0) return ErrnoStatus(errno, "agent binary: fchmod(memfd)");
  // F_SEAL_WRITE fails with EBUSY while any page of the memfd still carries an extra reference,
  // and pages just written sit in another CPU's LRU batch holding one until that CPU drains it
  // (seen in CI: sbxd refused to start). Nobody else holds this fd and it was never mapped, so
  // F_SEAL_FUTURE_WRITE, which does not wait for those references, makes it just as immutable.
  constexpr int kFixed = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (::fcntl(mfd.get(), F_ADD_SEALS, kFixed | F_SEAL_WRITE) != 0) {
    if (errno != EBUSY) return ErrnoStatus(errno, "agent binary: fcntl(memfd, F_ADD_SEALS)");
    if (::fcntl(mfd.get(), F_ADD_SEALS, kFixed | F_SEAL_FUTURE_WRITE) != 0) {
      return ErrnoStatus(errno, "agent binary: fcntl(memfd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE)");
    }
  }
  return AgentImage(std::move(mfd), static_cast<size_t>(st.st_size));
}

}  // namespace sbx::runtime::ns
