// The hard disk cap of a sandbox (resources.disk_mib): its writable layer lives in an ext4 file
// system of exactly that size, in a sparse image file, on a loop device. Writes past the cap get
// ENOSPC inside the sandbox and touch nothing else. No quotas are involved (this kernel has
// none for ext4, xfs or tmpfs: docs/isolation.md §4.4).
//
// Per size, one "golden" empty image is made once with mke2fs (<state>/disk-images/
// golden-<size>m.img, holding the empty directories `upper` and `work`). A sandbox's image is a
// sparse copy of it; it is attached to a loop device (autoclear) and mounted as a *detached*
// mount (fsopen/fsmount): the mount fd is attached nowhere, so the disk never shows in the
// host's mount table. The launch child move_mount()s it into the sandbox's own mount namespace
// and puts the overlay's upperdir/workdir in it. When that namespace dies, the mount goes, the
// loop device detaches itself, and the image is an ordinary file to delete.
//
// Thread safety: PreparedDisk is a value (one owner at a time); DiskProvider's methods may be
// called concurrently.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "runtime/ns/loop_device.h"
#include "runtime/ns/ready_pool.h"

namespace sbx::runtime::ns {

// ext4 needs a few MiB for its own metadata; below this there is little room for files.
inline constexpr int kMinDiskMib = 16;
// 1 TiB, the default sandbox.limits.max_disk_mib (runtime/resources.h): images are sparse, so
// this is a cap, not a cost.
inline constexpr int kMaxDiskMib = 1 << 20;

// InvalidArgument naming resources.disk_mib unless kMinDiskMib <= size_mib <= kMaxDiskMib.
absl::Status ValidateDiskMib(int size_mib);

// A mounted, empty disk, ready for a launch. Unless Release()d, destruction closes the mount fd
// (the kernel unmounts a detached mount with its last fd, and the loop device then detaches
// itself) and unlinks the image.
class PreparedDisk {
 public:
  PreparedDisk() = default;
  PreparedDisk(UniqueFd mount_fd, std::string image_path, int size_mib, std::string loop_name);
  PreparedDisk(PreparedDisk&& o) noexcept;
  PreparedDisk& operator=(PreparedDisk&& o) noexcept;
  PreparedDisk(const PreparedDisk&) = delete;
  PreparedDisk& operator=(const PreparedDisk&) = delete;
  ~PreparedDisk();

  bool valid() const { return mount_fd_.valid(); }
  // The detached mount (O_CLOEXEC). The launch child attaches it with
  //   move_mount(fd, "", AT_FDCWD, "<dir>", MOVE_MOUNT_F_EMPTY_PATH)
  // and uses <dir>/upper and <dir>/work as the overlay's upperdir and workdir.
  int mount_fd() const { return mount_fd_.get(); }
  const std::string& image_path() const { return image_path_; }
  int size_mib() const { return size_mib_; }
  const std::string& loop_name() const { return loop_name_; }  // "loop3"

  // Makes `upper` and `work` (not the file system root) owned by uid:gid (through the mount fd, not
  // a path): for a sandbox whose root is an unprivileged host uid (user namespaces).
  absl::Status Chown(uid_t uid, gid_t gid);

  // Moves the image file (rename(2): same file system only). The loop device follows, since it
  // holds the open file, not its name.
  absl::Status RenameImage(const std::string& new_path);

  // After a successful launch: the sandbox's mount namespace holds the disk and the sandbox dir
  // owns the image file. Closes the mount fd (which unmounts nothing once it is attached) and
  // forgets the image. Returns the image path.
  std::string Release();

 private:
  void Reset();

  UniqueFd mount_fd_;
  std::string image_path_;
  int size_mib_ = 0;
  std::string loop_name_;
};

// Runs mke2fs to make an empty ext4 image of `size_mib` at `path` (replacing nothing: the file
// must not exist) with the directories `upper` and `work` owned by root. `mke2fs` is the
// program's path. Exposed for tests and measurements; DiskProvider caches the result.
absl::Status MakeGoldenImage(const std::string& mke2fs, const std::string& path, int size_mib);

// Copies `src` to a new file `dst` (O_EXCL, mode 0600) keeping holes: only the data extents
// (SEEK_DATA/SEEK_HOLE) are copied, with copy_file_range (a reflink where the file system can).
absl::Status SparseCopy(const std::string& src, const std::string& dst);

// Loop-attaches and mounts an existing image (detached). The image must be an ext4 file system
// made by MakeGoldenImage (or a copy of one). On error nothing is left attached; the image
// file is left alone.
// `loop` chooses the loop device's options (direct I/O is on by default: see the .cc).
absl::StatusOr<PreparedDisk> MountDiskImage(const std::string& image_path, int size_mib,
                                            const LoopAttachOptions& loop = {});

class DiskProvider {
 public:
  DiskProvider(std::string state_dir, int pool_size, int pool_size_mib);
  ~DiskProvider();  // stops the filler; pooled disks are unmounted and their images removed

  DiskProvider(const DiskProvider&) = delete;
  DiskProvider& operator=(const DiskProvider&) = delete;

  // What this host needs for disk caps; the messages say what to install or enable.
  absl::Status Probe();
  // For start-up, before Start(): removes everything under <state>/disk-images (pool images,
  // golden images of an older mke2fs, half-written temporaries) and detaches every loop device
  // whose backing file lies under the state dir (sandbox images of a crashed sbxd).
  absl::Status Sweep();
  // Starts the background thread (idle CPU priority) that keeps pool_size disks ready.
  void Start();

  // A mounted disk of size_mib whose image is at dest_image_path (which must not exist, on the
  // same file system as the state dir). From the pool when it holds one of that size, otherwise
  // made here (the golden image of a size is made on its first use).
  absl::StatusOr<PreparedDisk> Take(int size_mib, const std::string& dest_image_path);
  // The size pooled disks are made at from now on (a reload of sandbox.defaults.disk_mib): the
  // disks pooled at the old size are dropped (unmounted, images removed) and the filler makes
  // new ones. A disk of the old size still being built when this runs is dropped by Take.
  void SetPoolSizeMib(int size_mib);

  int ready() const;
  const std::string& images_dir() const { return images_dir_; }
  std::string GoldenPath(int size_mib) const;

 private:
  struct Golden {
    std::mutex mu;                  // held while mke2fs makes it
    std::atomic<bool> made{false};  // read without mu: a Take never waits behind the filler
  };

  absl::StatusOr<std::string> EnsureGolden(int size_mib);
  absl::StatusOr<PreparedDisk> Build(int size_mib, const std::string& image_path);
  absl::StatusOr<std::string> Mke2fs();
  absl::StatusOr<PreparedDisk> BuildPooled();

  const std::string state_dir_;
  const std::string images_dir_;
  const std::string pool_dir_;
  const int pool_size_;
  std::atomic<int> pool_size_mib_;

  std::mutex golden_mu_;  // guards goldens_ (the map), not the making of one image
  std::map<int, std::shared_ptr<Golden>> goldens_;
  std::string mke2fs_;    // resolved on first use, under golden_mu_

  std::atomic<uint64_t> next_pool_id_{0};
  std::set<std::string> logged_;  // kinds of filler errors already warned about (filler only)
  ReadyPool<PreparedDisk> pool_;  // last: its filler stops before the members above go
};

}  // namespace sbx::runtime::ns
