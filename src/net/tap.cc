#include "net/tap.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::net {

absl::Status CreatePersistentTap(const std::string& name, uint32_t owner) {
  if (name.empty() || name.size() >= IFNAMSIZ) {
    return absl::InvalidArgumentError(fmt::format("tap: bad interface name '{}'", name));
  }
  UniqueFd fd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "tap: open(/dev/net/tun)");
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name.data(), name.size());
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_TUN_EXCL;
  if (::ioctl(fd.get(), TUNSETIFF, &ifr) != 0) {
    const int e = errno;
    if (e == EBUSY || e == EEXIST) return absl::AlreadyExistsError(fmt::format("tap {}: exists", name));
    return ErrnoStatus(e, fmt::format("tap {}: ioctl(TUNSETIFF)", name));
  }
  if (owner != 0 && ::ioctl(fd.get(), TUNSETOWNER, static_cast<unsigned long>(owner)) != 0) {
    return ErrnoStatus(errno, fmt::format("tap {}: ioctl(TUNSETOWNER, {})", name, owner));
  }
  if (::ioctl(fd.get(), TUNSETPERSIST, 1) != 0) return ErrnoStatus(errno, fmt::format("tap {}: ioctl(TUNSETPERSIST)", name));
  return absl::OkStatus();
}

}  // namespace sbx::net
