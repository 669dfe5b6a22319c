#include "common/capset.h"

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace sbx {

int DropBoundingCaps(const CapsPlan& plan) {
  for (int cap = 0; cap <= plan.last_cap; ++cap) {
    if (plan.keep & (uint64_t{1} << cap)) continue;
    // EINVAL: the kernel does not know this capability (cap_last_cap raced a kernel change);
    // there is nothing to drop then.
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return errno;
  }
  return 0;
}

namespace {

int SetCaps(uint64_t keep, int* failed_step) {
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    *failed_step = 1;
    return errno;
  }
  struct __user_cap_header_struct hdr;
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  hdr.pid = 0;
  struct __user_cap_data_struct data[2];
  const uint32_t lo = static_cast<uint32_t>(keep);
  const uint32_t hi = static_cast<uint32_t>(keep >> 32);
  data[0].effective = data[0].permitted = data[0].inheritable = lo;
  data[1].effective = data[1].permitted = data[1].inheritable = hi;
  if (::syscall(SYS_capset, &hdr, data) != 0) {
    *failed_step = 2;
    return errno;
  }
  return 0;
}

}  // namespace

int ApplyCaps(const CapsPlan& plan, int* failed_step) {
  if (int err = DropBoundingCaps(plan); err != 0) {
    *failed_step = 0;
    return err;
  }
  return SetCaps(plan.keep, failed_step);
}

int ClearCaps() {
  int step = 0;
  return SetCaps(0, &step);
}

}  // namespace sbx
