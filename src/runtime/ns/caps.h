// Capabilities of the sandbox's processes: Docker's default set minus NET_RAW and MKNOD.
//
// The parent computes the masks once (libcap's name lookups allocate); the child applies them
// with prctl and the raw capset syscall, which do not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capset.h"

namespace sbx::runtime::ns {

using sbx::CapsPlan;

// Names (libcap spelling, e.g. "cap_chown") of the capabilities sandbox processes keep.
const std::vector<std::string>& SandboxCapabilityNames();

absl::StatusOr<CapsPlan> BuildCapsPlan();

// Child side: ApplyCaps (common/capset.h).
using sbx::ApplyCaps;

}  // namespace sbx::runtime::ns
