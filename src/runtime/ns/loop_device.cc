#include "runtime/ns/loop_device.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

// Another process may configure the device LOOP_CTL_GET_FREE just named before we do; each
// lost race costs one ioctl and a short wait, so the bound only matters when something else
// attaches devices in a tight loop.
constexpr int kMaxAttempts = 32;

// LOOP_CTL_GET_FREE names the same lowest free device to every caller until one of them has
// configured it, so N threads attaching at once lose up to N-1 races each: a burst of 50
// creates ran out of attempts (EBUSY) and failed creates. sbxd's own attaches (launches and
// the disk pool's filler) therefore take turns; only other processes can still race them.
std::mutex& AttachMutex() {
  static std::mutex mu;
  return mu;
}

void FillInfo(struct loop_info64* info, const std::string& backing_path, uint32_t flags) {
  info->lo_flags = flags;
  // Only informative (losetup -a shows it); the kernel's own backing_file is the real path.
  std::strncpy(reinterpret_cast<char*>(info->lo_file_name), backing_path.c_str(),
               LO_NAME_SIZE - 1);
}

// Kernels before 5.8 have no LOOP_CONFIGURE: the same in three steps, of which only the first
// can race with another attacher.
int LegacyConfigure(int dev_fd, int backing_fd, const std::string& backing_path, uint32_t flags) {
  if (::ioctl(dev_fd, LOOP_SET_FD, backing_fd) != 0) return errno;
  struct loop_info64 info{};
  FillInfo(&info, backing_path, flags & ~static_cast<uint32_t>(LO_FLAGS_DIRECT_IO));
  if (::ioctl(dev_fd, LOOP_SET_STATUS64, &info) != 0) {
    int err = errno;
    ::ioctl(dev_fd, LOOP_CLR_FD, 0);
    return err == EBUSY ? EIO : err;  // EBUSY means "retry another device" to the caller
  }
  if ((flags & LO_FLAGS_DIRECT_IO) != 0) ::ioctl(dev_fd, LOOP_SET_DIRECT_IO, 1UL);
  return 0;
}

}  // namespace

std::string LoopDevice::name() const { return fmt::format("loop{}", number_); }

absl::StatusOr<LoopDevice> LoopDevice::Attach(int backing_fd, const std::string& backing_path,
                                              const LoopAttachOptions& options) {
  UniqueFd ctl(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl) return ErrnoStatus(errno, "loop attach: open(/dev/loop-control)");
  uint32_t flags = LO_FLAGS_AUTOCLEAR;
  if (options.read_only) flags |= LO_FLAGS_READ_ONLY;
  if (options.direct_io) flags |= LO_FLAGS_DIRECT_IO;
  bool legacy = false;
  int last_err = 0;
  std::unique_lock<std::mutex> turn(AttachMutex());
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    if (attempt > 0) {
      // Another process won the device: give it time to finish configuring it, so the next
      // LOOP_CTL_GET_FREE names another one (up to ~25 ms over all attempts). sbxd's other
      // attaches need not wait out this one's back-off: the turn is given up while it sleeps.
      turn.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 50 << std::min(attempt - 1, 5))));
      turn.lock();
    }
    int n = ::ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return ErrnoStatus(errno, "loop attach: ioctl(/dev/loop-control, LOOP_CTL_GET_FREE)");
    std::string path = fmt::format("/dev/loop{}", n);
    UniqueFd dev(::open(path.c_str(), (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
    if (!dev) {
      // ENXIO/ENOENT: the device was removed (loop-control LOOP_CTL_REMOVE) between the two calls.
      if (errno == ENXIO || errno == ENOENT) {
        last_err = errno;
        continue;
      }
      return ErrnoStatus(errno, fmt::format("loop attach: open({})", path));
    }
    int err = 0;
    if (!legacy) {
      struct loop_config cfg{};
      cfg.fd = static_cast<uint32_t>(backing_fd);
      FillInfo(&cfg.info, backing_path, flags);
      err = ::ioctl(dev.get(), LOOP_CONFIGURE, &cfg) == 0 ? 0 : errno;
      if (err == EINVAL && (flags & LO_FLAGS_DIRECT_IO) != 0) {
        // Some kernels refuse direct I/O outright when the backing file system cannot do it.
        flags &= ~static_cast<uint32_t>(LO_FLAGS_DIRECT_IO);
        FillInfo(&cfg.info, backing_path, flags);
        err = ::ioctl(dev.get(), LOOP_CONFIGURE, &cfg) == 0 ? 0 : errno;
      }
      if (err == EINVAL || err == ENOTTY) {
        legacy = true;  // no LOOP_CONFIGURE (before 5.8)
        err = LegacyConfigure(dev.get(), backing_fd, backing_path, flags);
      }
    } else {
      err = LegacyConfigure(dev.get(), backing_fd, backing_path, flags);
    }
    if (err == EBUSY || err == ENXIO) {
      last_err = err;
      continue;
    }
    if (err != 0) {
      return ErrnoStatus(err, fmt::format("loop attach: ioctl({}, LOOP_CONFIGURE, {})", path,
                                          backing_path));
    }
    LoopDevice d;
    d.fd_ = std::move(dev);
    d.number_ = n;
    d.path_ = std::move(path);
    struct loop_info64 info{};
    if (::ioctl(d.fd_.get(), LOOP_GET_STATUS64, &info) == 0) {
      d.direct_io_ = (info.lo_flags & LO_FLAGS_DIRECT_IO) != 0;
      if ((info.lo_flags & LO_FLAGS_AUTOCLEAR) == 0) {
        // Without autoclear a crash would leak the device: refuse rather than rely on sweeps.
        return absl::InternalError(
            fmt::format("loop attach: {} came up without LO_FLAGS_AUTOCLEAR", d.path_));
      }
    }
    return d;
  }
  return ErrnoStatus(last_err, fmt::format("loop attach: no free loop device for {} after {} "
                                           "attempts (all taken concurrently)",
                                           backing_path, kMaxAttempts));
}

absl::StatusOr<std::string> LoopBackingFile(const std::string& loop_name,
                                            const std::string& sys_block) {
  auto text = ReadFileToString(fmt::format("{}/{}/loop/backing_file", sys_block, loop_name));
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(fmt::format("loop backing file: {} is not attached", loop_name));
    }
    return text.status();
  }
  std::string s = std::move(*text);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

bool BackingFileUnder(const std::string& backing_file, const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (d.empty() || d[0] != '/') return false;
  std::string f = backing_file;
  constexpr std::string_view kDeleted = " (deleted)";
  if (f.size() > kDeleted.size() && f.ends_with(kDeleted)) f.resize(f.size() - kDeleted.size());
  if (d == "/") return f.starts_with("/");
  return f == d || (f.size() > d.size() && f.starts_with(d) && f[d.size()] == '/');
}

absl::StatusOr<LoopSweepResult> SweepLoopDevices(const std::string& dir,
                                                 const std::string& sys_block) {
  SBX_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDir(sys_block));
  LoopSweepResult result;
  absl::Status first_error = absl::OkStatus();
  for (const std::string& name : entries) {
    if (!name.starts_with("loop")) continue;
    auto backing = LoopBackingFile(name, sys_block);
    if (!backing.ok() || !BackingFileUnder(*backing, dir)) continue;
    std::string dev_path = "/dev/" + name;
    int err = 0;
    {
      UniqueFd dev(::open(dev_path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!dev) {
        err = errno;
      } else if (::ioctl(dev.get(), LOOP_CLR_FD, 0) != 0) {
        err = errno;
      }
      // Recent kernels only set autoclear here and detach at the last close, i.e. this one
      // unless a mount holds the device.
    }
    if (err == ENXIO || err == ENOENT) continue;  // it detached itself meanwhile
    if (err != 0) {
      if (first_error.ok()) {
        first_error = ErrnoStatus(err, fmt::format("loop sweep: ioctl({}, LOOP_CLR_FD) of {}",
                                                   dev_path, *backing));
      }
      continue;
    }
    if (absl::IsNotFound(LoopBackingFile(name, sys_block).status())) {
      ++result.detached;
    } else {
      ++result.in_use;
    }
  }
  if (!first_error.ok()) return first_error;
  return result;
}

}  // namespace sbx::runtime::ns
