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

}  // namespace sbx::runtime::ns
