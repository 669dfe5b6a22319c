// Loop devices attached in-process (no `losetup`): a sandbox's disk image becomes a block device
// that ext4 can mount.
//
// Every device is attached with LO_FLAGS_AUTOCLEAR: the kernel detaches it when its last opener
// goes away. Once the ext4 mount holds it, that is the end of the mount, i.e. the death of the
// sandbox's mount namespace or the close of a detached mount's fd, also when sbxd crashes. So
// the only thing a LoopDevice owns is its open fd; closing it before anything else opened the
// device detaches the device at once.
//
// Thread safety: LoopDevice is a value owned by one thread at a time; Attach and
// SweepLoopDevices may run concurrently with each other (and with other processes' losetup):
// a free device taken by someone else between LOOP_CTL_GET_FREE and LOOP_CONFIGURE is retried.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

struct LoopAttachOptions {
  // LO_FLAGS_DIRECT_IO: the device reads and writes the backing file with O_DIRECT, so a page is
  // cached once (in the mounted file system) instead of twice. Dropped silently when the
  // backing file system refuses it (Attach reports what it got in direct_io()).
  bool direct_io = true;
  bool read_only = false;
};

class LoopDevice {
 public:
  LoopDevice() = default;
  LoopDevice(LoopDevice&&) noexcept = default;
  LoopDevice& operator=(LoopDevice&&) noexcept = default;

  // Attaches a free loop device to `backing_fd` (an open regular file; the device keeps its own
  // reference, so the caller may close it afterwards). `backing_path` only names the file in
  // errors.
  static absl::StatusOr<LoopDevice> Attach(int backing_fd, const std::string& backing_path,
                                           const LoopAttachOptions& options = {});

  bool valid() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  int number() const { return number_; }
  const std::string& path() const { return path_; }  // "/dev/loop3"
  std::string name() const;                          // "loop3"
  bool direct_io() const { return direct_io_; }

  // Closes our fd: with nobody else holding the device it detaches now, otherwise when the last
  // holder (the mount) lets go.
  void Close() { fd_.Reset(); }

 private:
  UniqueFd fd_;
  int number_ = -1;
  std::string path_;
  bool direct_io_ = false;
};

// The file behind /dev/loopN as the kernel reports it (/sys/block/loopN/loop/backing_file; it
// follows renames, and ends in " (deleted)" once the file was unlinked). NotFound when the
// device is not attached.
absl::StatusOr<std::string> LoopBackingFile(const std::string& loop_name,
                                            const std::string& sys_block = "/sys/block");

// For sbxd's start-up: detaches every loop device whose backing file lies under `dir` (a
// directory that only sbx writes, e.g. the state dir). A device still mounted somewhere (a
// sandbox that survived sbxd) cannot be torn down: LOOP_CLR_FD only marks it for autoclear, and
// it goes with its last mount. Devices of other files are never touched.
struct LoopSweepResult {
  int detached = 0;  // gone now
  int in_use = 0;    // still held by a mount; autoclear set
};
absl::StatusOr<LoopSweepResult> SweepLoopDevices(const std::string& dir,
                                                 const std::string& sys_block = "/sys/block");

// True when `backing_file` (as LoopBackingFile reports it) is `dir` itself or below it. Pure;
// exposed for tests.
bool BackingFileUnder(const std::string& backing_file, const std::string& dir);

}  // namespace sbx::runtime::ns
