#include "runtime/ns/caps.h"

#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

const std::vector<std::string>& SandboxCapabilityNames() {
  // Docker's default set without cap_net_raw (raw sockets: spoofing, ARP/ICMP tricks) and
  // cap_mknod (the sandbox's /dev is prepared by us; new device nodes are not needed).
  static const std::vector<std::string> kNames = {
      "cap_chown",        "cap_dac_override", "cap_fsetid",     "cap_fowner",
      "cap_setgid",       "cap_setuid",       "cap_setpcap",    "cap_net_bind_service",
      "cap_sys_chroot",   "cap_kill",         "cap_audit_write", "cap_setfcap",
  };
  return kNames;
}

absl::StatusOr<CapsPlan> BuildCapsPlan() {
  CapsPlan plan;
  for (const std::string& name : SandboxCapabilityNames()) {
    cap_value_t v;
    if (cap_from_name(name.c_str(), &v) != 0 || v < 0 || v > 63) {
      return absl::InternalError(fmt::format("capabilities: libcap does not know {}", name));
    }
    plan.keep |= uint64_t{1} << v;
  }
  auto text = ReadFileToString("/proc/sys/kernel/cap_last_cap");
  if (text.ok()) {
    plan.last_cap = std::atoi(text->c_str());
  } else {
    plan.last_cap = static_cast<int>(cap_max_bits()) - 1;
  }
  if (plan.last_cap <= 0 || plan.last_cap > 63) {
    return absl::InternalError(fmt::format("capabilities: implausible cap_last_cap {}", plan.last_cap));
  }
  return plan;
}

int ApplyCaps(const CapsPlan& plan, int* failed_step) {
  for (int cap = 0; cap <= plan.last_cap; ++cap) {
    if (plan.keep & (uint64_t{1} << cap)) continue;
    // EINVAL: the kernel does not know this capability (cap_last_cap raced a kernel change);
    // there is nothing to drop then.
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {
      *failed_step = 0;
      return errno;
    }
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    *failed_step = 1;
    return errno;
  }
  struct __user_cap_header_struct hdr;
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  hdr.pid = 0;
  struct __user_cap_data_struct data[2];
  const uint32_t lo = static_cast<uint32_t>(plan.keep);
  const uint32_t hi = static_cast<uint32_t>(plan.keep >> 32);
  data[0].effective = data[0].permitted = data[0].inheritable = lo;
  data[1].effective = data[1].permitted = data[1].inheritable = hi;
  if (::syscall(SYS_capset, &hdr, data) != 0) {
    *failed_step = 2;
    return errno;
  }
  return 0;
}

}  // namespace sbx::runtime::ns
