// Density at start-up (docs/operations.md, "Density"): sbxd's descriptor limit, and the number
// of sandboxes this host's limits hold.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/config.h"

namespace sbx::daemon {

// Raises the soft RLIMIT_NOFILE to the hard one (no privilege needed); a failure is logged.
// Logs, too, what sbx::CloseInheritedDescriptors closed first thing in main (`inherited`).
void RaiseOpenFiles(const absl::StatusOr<int>& inherited);

// How many sandboxes the host holds, with `held_fds` descriptors kept for connections: the cap
// of admission.max_sandboxes 0. An explicit maximum the host cannot hold is FailedPrecondition
// naming what is short.
absl::StatusOr<int64_t> ResolveDensity(const Config& cfg, int64_t held_fds);

}  // namespace sbx::daemon
