// Capabilities of the sandbox's processes: Docker's default set minus NET_RAW and MKNOD.
//
// The parent computes the masks once (libcap's name lookups allocate); the child applies them
// with prctl and the raw capset syscall, which do not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

struct CapsPlan {
  uint64_t keep = 0;   // bit n = capability n
  int last_cap = 0;    // highest capability number the kernel knows
};

// Names (libcap spelling, e.g. "cap_chown") of the capabilities sandbox processes keep.
const std::vector<std::string>& SandboxCapabilityNames();

absl::StatusOr<CapsPlan> BuildCapsPlan();

// Child side: drops every other capability from the bounding set, clears the ambient set and
// sets permitted = effective = inheritable = keep. Returns 0 or an errno value, and in
// *failed_step 0 (bounding set), 1 (ambient) or 2 (capset).
int ApplyCaps(const CapsPlan& plan, int* failed_step);

}  // namespace sbx::runtime::ns
