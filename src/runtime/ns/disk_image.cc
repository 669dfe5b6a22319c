#include "runtime/ns/disk_image.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/process.h"
#include "common/status_util.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

// The kernel's own explanation of a failed fsconfig (the fs context's message log).
std::string FsContextMessages(int fs_fd) {
  std::string out;
  char buf[512];
  for (int i = 0; i < 8; ++i) {
    ssize_t n = ::read(fs_fd, buf, sizeof(buf) - 1);
    if (n <= 0) break;
    if (!out.empty()) out += "; ";
    out.append(buf, static_cast<size_t>(n));
  }
  return out.empty() ? out : " [" + out + "]";
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::Status ValidateDiskMib(int size_mib) {
  if (size_mib < kMinDiskMib || size_mib > kMaxDiskMib) {
    return FieldError("resources.disk_mib",
                      fmt::format("resources.disk_mib must be between {} and {} (MiB), got {}",
                                  kMinDiskMib, kMaxDiskMib, size_mib));
  }
  return absl::OkStatus();
}

// ---- PreparedDisk ------------------------------------------------------------------------------

PreparedDisk::PreparedDisk(UniqueFd mount_fd, std::string image_path, int size_mib,
                           std::string loop_name)
    : mount_fd_(std::move(mount_fd)),
      image_path_(std::move(image_path)),
      size_mib_(size_mib),
      loop_name_(std::move(loop_name)) {}

PreparedDisk::PreparedDisk(PreparedDisk&& o) noexcept
    : mount_fd_(std::move(o.mount_fd_)),
      image_path_(std::exchange(o.image_path_, {})),
      size_mib_(std::exchange(o.size_mib_, 0)),
      loop_name_(std::exchange(o.loop_name_, {})) {}

PreparedDisk& PreparedDisk::operator=(PreparedDisk&& o) noexcept {
  if (this != &o) {
    Reset();
    mount_fd_ = std::move(o.mount_fd_);
    image_path_ = std::exchange(o.image_path_, {});
    size_mib_ = std::exchange(o.size_mib_, 0);
    loop_name_ = std::exchange(o.loop_name_, {});
  }
  return *this;
}

PreparedDisk::~PreparedDisk() { Reset(); }

void PreparedDisk::Reset() {
  // Closing the last fd of a detached mount unmounts it; the autoclear loop device follows. The
  // image may go first: the loop device holds the open file until then.
  mount_fd_.Reset();
  if (!image_path_.empty()) ::unlink(image_path_.c_str());
  image_path_.clear();
}

absl::Status PreparedDisk::Chown(uid_t uid, gid_t gid) {
  if (!mount_fd_) return absl::FailedPreconditionError("disk chown: no mount");
  for (const char* dir : {"upper", "work"}) {
    if (::fchownat(mount_fd_.get(), dir, uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoStatus(errno, fmt::format("disk chown: fchownat({}:{}/{}, {}:{})", image_path_,
                                            loop_name_, dir, uid, gid));
    }
  }
  return absl::OkStatus();
}

absl::Status PreparedDisk::RenameImage(const std::string& new_path) {
  // NOREPLACE: like Take's inline path (O_EXCL), never clobber a file that is there.
  if (::renameat2(AT_FDCWD, image_path_.c_str(), AT_FDCWD, new_path.c_str(), RENAME_NOREPLACE) !=
      0) {
    return ErrnoStatus(errno, fmt::format("disk image: renameat2({}, {}, RENAME_NOREPLACE)",
                                          image_path_, new_path));
  }
  image_path_ = new_path;
  return absl::OkStatus();
}

std::string PreparedDisk::Release() {
  mount_fd_.Reset();
  return std::exchange(image_path_, {});
}

// ---- image files -------------------------------------------------------------------------------

absl::Status MakeGoldenImage(const std::string& mke2fs, const std::string& path, int size_mib) {
  SBX_RETURN_IF_ERROR(ValidateDiskMib(size_mib));
  // mke2fs -d copies a directory tree into the new file system: the two empty directories the
  // overlay needs, so no sandbox has to create them.
  std::string tmpl = path + ".tmpl-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return ErrnoStatus(errno, fmt::format("golden image: mkdtemp({})", tmpl));
  }
  struct TreeGuard {
    std::string dir;
    ~TreeGuard() { (void)RemoveTree(dir); }
  } guard{tmpl};
  for (const char* sub : {"upper", "work"}) {
    std::string d = fmt::format("{}/{}", tmpl, sub);
    if (::mkdir(d.c_str(), 0755) != 0) {
      return ErrnoStatus(errno, fmt::format("golden image: mkdir({})", d));
    }
  }
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) return ErrnoStatus(errno, fmt::format("golden image: open({}, O_CREAT|O_EXCL)", path));
    if (::ftruncate(fd.get(), static_cast<off_t>(size_mib) * kMiB) != 0) {
      int err = errno;
      ::unlink(path.c_str());
      return ErrnoStatus(err, fmt::format("golden image: ftruncate({}, {} MiB)", path, size_mib));
    }
  }
  // -T default -b 4096: one inode per 16 KiB and 4 KiB blocks at every size. mke2fs would give
  // images under 512 MiB 1 KiB blocks and an inode per 4 KiB, i.e. 10% of a small cap lost to
  // inode tables and a different files-per-MiB at each size.
  // No journal: the upper layer is scratch (the overlay is mounted `volatile`) and a journal
  // would cost every sandbox its size in written blocks. No reserved blocks, no resize inode:
  // the sandbox gets all of disk_mib that ext4 does not need for itself.
  // lazy_itable_init: mke2fs leaves the inode tables unwritten (holes); the mount uses
  // noinit_itable so that the kernel does not fill them in later either.
  std::vector<std::string> argv = {
      mke2fs, "-q", "-F", "-t", "ext4", "-T", "default", "-b", "4096", "-m", "0",
      "-O", "^has_journal,^resize_inode",
      "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
      "-d", tmpl, path};
  std::string output;
  auto rc = RunProgram(argv, &output);
  if (!rc.ok() || *rc != 0) {
    ::unlink(path.c_str());
    if (!rc.ok()) return Annotate(rc.status(), "golden image");
    while (!output.empty() && output.back() == '\n') output.pop_back();
    return absl::InternalError(fmt::format("golden image: {} {} exited with status {}: {}",
                                           mke2fs, path, *rc, output));
  }
  return absl::OkStatus();
}

absl::Status SparseCopy(const std::string& src, const std::string& dst) {
  UniqueFd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return ErrnoStatus(errno, fmt::format("sparse copy: open({})", src));
  struct stat st;
  if (::fstat(in.get(), &st) != 0) return ErrnoStatus(errno, fmt::format("sparse copy: fstat({})", src));
  UniqueFd out(::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!out) return ErrnoStatus(errno, fmt::format("sparse copy: open({}, O_CREAT|O_EXCL)", dst));
  auto fail = [&](int err, const std::string& what) {
    ::unlink(dst.c_str());
    return ErrnoStatus(err, fmt::format("sparse copy {} -> {}: {}", src, dst, what));
  };
  if (::ftruncate(out.get(), st.st_size) != 0) return fail(errno, "ftruncate");
  off_t pos = 0;
  bool use_cfr = true;
  std::vector<char> buf;
  while (pos < st.st_size) {
    off_t data = ::lseek(in.get(), pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // only a hole is left
      return fail(errno, "lseek(SEEK_DATA)");
    }
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) return fail(errno, "lseek(SEEK_HOLE)");
    off_t off_in = data;
    off_t off_out = data;
    while (off_in < hole) {
      size_t len = static_cast<size_t>(hole - off_in);
      if (use_cfr) {
        ssize_t n = ::copy_file_range(in.get(), &off_in, out.get(), &off_out, len, 0);
        if (n > 0) continue;
        if (n == 0) return fail(EIO, "copy_file_range: unexpected end of file");
        if (errno == EINTR) continue;
        if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
          return fail(errno, "copy_file_range");
        }
        use_cfr = false;  // an old kernel or a file system pair it cannot do: plain copies
      }
      if (buf.empty()) buf.resize(1 << 20);
      size_t chunk = std::min(len, buf.size());
      ssize_t r = ::pread(in.get(), buf.data(), chunk, off_in);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return fail(r < 0 ? errno : EIO, "pread");
      ssize_t done = 0;
      while (done < r) {
        ssize_t w = ::pwrite(out.get(), buf.data() + done, static_cast<size_t>(r - done),
                             off_out + done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return fail(w < 0 ? errno : EIO, "pwrite");
        done += w;
      }
      off_in += r;
      off_out += r;
    }
    pos = hole;
  }
  if (out.Close() != 0) return fail(errno, "close");
  return absl::OkStatus();
}

absl::StatusOr<PreparedDisk> MountDiskImage(const std::string& image_path, int size_mib,
                                            const LoopAttachOptions& loop_options) {
  UniqueFd image(::open(image_path.c_str(), O_RDWR | O_CLOEXEC));
  if (!image) return ErrnoStatus(errno, fmt::format("disk mount: open({})", image_path));
  SBX_ASSIGN_OR_RETURN(LoopDevice loop, LoopDevice::Attach(image.get(), image_path, loop_options));
  image.Reset();  // the loop device holds the file now
  // From here, an error return closes the loop fd, and autoclear detaches the device.
  UniqueFd fs(::fsopen("ext4", FSOPEN_CLOEXEC));
  if (!fs) return ErrnoStatus(errno, "disk mount: fsopen(ext4)");
  auto config = [&](unsigned cmd, const char* key, const char* value,
                    const std::string& what) -> absl::Status {
    if (::fsconfig(fs.get(), cmd, key, value, 0) == 0) return absl::OkStatus();
    int err = errno;
    return ErrnoStatus(err, fmt::format("disk mount: fsconfig(ext4 on {} for {}, {}){}",
                                        loop.path(), image_path, what,
                                        FsContextMessages(fs.get())));
  };
  SBX_RETURN_IF_ERROR(config(FSCONFIG_SET_STRING, "source", loop.path().c_str(), "source"));
  // Without it the kernel's lazyinit thread zeroes the inode tables mke2fs left as holes,
  // making every sparse image dense (about 1/64 of disk_mib each) in the background.
  SBX_RETURN_IF_ERROR(config(FSCONFIG_SET_FLAG, "noinit_itable", nullptr, "noinit_itable"));
  SBX_RETURN_IF_ERROR(config(FSCONFIG_CMD_CREATE, nullptr, nullptr, "FSCONFIG_CMD_CREATE"));
  UniqueFd mnt(::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) {
    return ErrnoStatus(errno, fmt::format("disk mount: fsmount(ext4 on {} for {})", loop.path(),
                                          image_path));
  }
  std::string loop_name = loop.name();
  loop.Close();  // the superblock holds the device; autoclear now waits for the mount only
  return PreparedDisk(std::move(mnt), image_path, size_mib, std::move(loop_name));
}

// ---- DiskProvider ------------------------------------------------------------------------------

DiskProvider::DiskProvider(std::string state_dir, int pool_size, int pool_size_mib)
    : state_dir_(std::move(state_dir)),
      images_dir_(state_dir_ + "/disk-images"),
      pool_dir_(images_dir_ + "/pool"),
      pool_size_(std::max(0, pool_size)),
      pool_size_mib_(pool_size_mib),
      pool_(pool_size_, [this] { return BuildPooled(); }, [this](const absl::Status& st) {
        std::string msg(st.message());
        // One warning per kind of error (its step), not per attempt.
        if (logged_.insert(msg.substr(0, msg.find(':'))).second) {
          spdlog::warn("disk pool: {} (launches make their disks in place meanwhile)", msg);
        } else {
          spdlog::debug("disk pool: {}", msg);
        }
        return true;
      }, [](PreparedDisk& disk) {
        // Built as N.img.part, pooled as N.img: an .img in the pool directory is always one
        // the pool holds (sizes of a reload's drain are then exact, for an operator and tests).
        std::string path = disk.image_path();
        return disk.RenameImage(path.substr(0, path.size() - 5));
      }) {}

// The pool's destructor stops the filler; each pooled disk then unmounts and removes its image.
DiskProvider::~DiskProvider() = default;

std::string DiskProvider::GoldenPath(int size_mib) const {
  return fmt::format("{}/golden-{}m.img", images_dir_, size_mib);
}

absl::StatusOr<std::string> DiskProvider::Mke2fs() {
  std::lock_guard lock(golden_mu_);
  if (!mke2fs_.empty()) return mke2fs_;
  if (auto found = FindProgram("mke2fs"); found.ok()) {
    mke2fs_ = *found;
    return mke2fs_;
  }
  return absl::FailedPreconditionError(
      "disk caps: mke2fs not found in /usr/sbin, /sbin or PATH (install e2fsprogs: "
      "apt-get install e2fsprogs)");
}

absl::Status DiskProvider::Probe() {
  SBX_RETURN_IF_ERROR(Mke2fs().status());
  {
    UniqueFd ctl(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
    if (!ctl) {
      int err = errno;
      return Annotate(ErrnoStatus(err, "open(/dev/loop-control)"),
                      err == ENOENT ? "disk caps: no loop driver (build the kernel with "
                                      "CONFIG_BLK_DEV_LOOP or modprobe loop; in a container, "
                                      "pass /dev/loop-control and the /dev/loopN devices)"
                                    : "disk caps: loop devices unusable (sbxd needs root with "
                                      "CAP_SYS_ADMIN)");
    }
  }
  auto filesystems = ReadFileToString("/proc/filesystems");
  if (!filesystems.ok()) return Annotate(filesystems.status(), "disk caps");
  if (filesystems->find("\text4\n") == std::string::npos) {
    return absl::FailedPreconditionError(
        "disk caps: ext4 is not in /proc/filesystems (build the kernel with CONFIG_EXT4_FS or "
        "modprobe ext4)");
  }
  UniqueFd fs(::fsopen("ext4", FSOPEN_CLOEXEC));
  if (!fs) {
    return Annotate(ErrnoStatus(errno, "fsopen(ext4)"),
                    "disk caps: the new mount API is needed (Linux 5.2 or later; a seccomp "
                    "profile around sbxd must allow fsopen/fsconfig/fsmount/move_mount)");
  }
  return absl::OkStatus();
}

absl::Status DiskProvider::Sweep() {
  // Loop devices first: an image whose device is still attached would not free its blocks.
  // Paths in /sys are canonical, so compare with the canonical state dir.
  char* real = ::realpath(state_dir_.c_str(), nullptr);
  if (real == nullptr) {
    if (errno == ENOENT) return absl::OkStatus();  // a first start: nothing to sweep
    return ErrnoStatus(errno, fmt::format("disk sweep: realpath({})", state_dir_));
  }
  std::string canonical = real;
  ::free(real);
  auto swept = SweepLoopDevices(canonical);
  if (!swept.ok()) return Annotate(swept.status(), "disk sweep");
  if (swept->detached > 0 || swept->in_use > 0) {
    spdlog::info("disk sweep: detached {} loop device(s) backed by files under {}; {} still "
                 "mounted (they detach with their mount)",
                 swept->detached, canonical, swept->in_use);
  }
  SBX_RETURN_IF_ERROR(Annotate(RemoveTree(images_dir_), "disk sweep"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> DiskProvider::EnsureGolden(int size_mib) {
  std::shared_ptr<Golden> g;
  {
    std::lock_guard lock(golden_mu_);
    auto& slot = goldens_[size_mib];
    if (!slot) slot = std::make_shared<Golden>();
    g = slot;
  }
  std::string path = GoldenPath(size_mib);
  if (g->made.load(std::memory_order_acquire)) return path;
  SBX_ASSIGN_OR_RETURN(std::string mke2fs, Mke2fs());
  std::lock_guard lock(g->mu);
  if (g->made.load(std::memory_order_acquire)) return path;
  SBX_RETURN_IF_ERROR(Annotate(MkdirAll(images_dir_, 0700), "golden image"));
  // Made under a temporary name and renamed, so a crash never leaves a half-made golden image
  // that a later copy would take for a good one.
  std::string tmp = fmt::format("{}.tmp-{}", path, ::gettid());
  ::unlink(tmp.c_str());
  SBX_RETURN_IF_ERROR(MakeGoldenImage(mke2fs, tmp, size_mib));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, fmt::format("golden image: rename({}, {})", tmp, path));
  }
  g->made.store(true, std::memory_order_release);
  return path;
}

absl::StatusOr<PreparedDisk> DiskProvider::Build(int size_mib, const std::string& image_path) {
  SBX_ASSIGN_OR_RETURN(std::string golden, EnsureGolden(size_mib));
  if (!IsRegularFile(golden)) {
    // Someone removed it behind our back (a manual clean-up): make it again once.
    {
      std::lock_guard lock(golden_mu_);
      goldens_.erase(size_mib);
    }
    SBX_ASSIGN_OR_RETURN(golden, EnsureGolden(size_mib));
  }
  SBX_RETURN_IF_ERROR(SparseCopy(golden, image_path));
  auto disk = MountDiskImage(image_path, size_mib);
  if (!disk.ok()) {
    ::unlink(image_path.c_str());
    return disk;
  }
  // A fresh file system has nothing cached: the first chown of `upper` and the overlay's
  // set-up in `work` (a directory, a whiteout, xattrs) would each wait for inode-table and
  // bitmap reads from the image, on the launch path (measured 0.5-1.5 ms for the chown
  // alone). Touch them here, where a pooled disk is built off that path.
  struct stat st;
  for (const char* dir : {"upper", "work"}) (void)::fstatat(disk->mount_fd(), dir, &st, AT_SYMLINK_NOFOLLOW);
  if (::mkdirat(disk->mount_fd(), "work/.warm", 0700) == 0) {
    (void)::unlinkat(disk->mount_fd(), "work/.warm", AT_REMOVEDIR);
  }
  return disk;
}

absl::StatusOr<PreparedDisk> DiskProvider::Take(int size_mib, const std::string& dest_image_path) {
  SBX_RETURN_IF_ERROR(ValidateDiskMib(size_mib));
  if (size_mib == pool_size_mib_.load()) {
    struct stat st;
    if (::lstat(dest_image_path.c_str(), &st) == 0) {
      return ErrnoStatus(EEXIST, fmt::format("disk image: {} exists", dest_image_path));
    }
    std::optional<PreparedDisk> pooled = pool_.Take();
    // One of an older pool size (made while SetPoolSizeMib ran) is dropped: its destructor
    // removes it.
    if (pooled && pooled->valid() && pooled->size_mib() == size_mib) {
      PreparedDisk disk = std::move(*pooled);
      absl::Status st = disk.RenameImage(dest_image_path);
      if (st.ok()) return disk;
      // e.g. EXDEV (the sandbox dir on another file system): the pooled disk is dropped (its
      // destructor removes it) and one is made in place (which fails too if dest appeared).
      spdlog::warn("{} (making the disk in place)", std::string(st.message()));
    }
  }
  return Build(size_mib, dest_image_path);
}

int DiskProvider::ready() const { return pool_.ready(); }

void DiskProvider::SetPoolSizeMib(int size_mib) {
  if (!ValidateDiskMib(size_mib).ok() || pool_size_mib_.exchange(size_mib) == size_mib) return;
  const size_t dropped = pool_.Drain().size();  // destroyed here: unmounted, images removed
  spdlog::info("disk pool: now making {} MiB disks ({} pooled disk(s) of the old size dropped)",
               size_mib, dropped);
}

void DiskProvider::Start() {
  // The golden image first, at normal priority: a launch needing the same size would wait for
  // it, and must not wait behind an idle-priority thread.
  pool_.Start([this] { (void)EnsureGolden(pool_size_mib_.load()); });
}

absl::StatusOr<PreparedDisk> DiskProvider::BuildPooled() {
  const std::string path = fmt::format("{}/{}.img.part", pool_dir_, next_pool_id_++);
  SBX_RETURN_IF_ERROR(Annotate(MkdirAll(pool_dir_, 0700), "disk pool"));
  return Build(pool_size_mib_.load(), path);
}

}  // namespace sbx::runtime::ns
