// Applying a capability set between fork/clone and exec: prctl and the raw capset syscall
// only, no allocation. Shared by the ns launcher (the agent's own set) and by sbx-agent (the set
// of every process it starts inside the sandbox's user namespace).
#pragma once

#include <cstdint>

namespace sbx {

struct CapsPlan {
  uint64_t keep = 0;   // bit n = capability n
  int last_cap = 0;    // highest capability number the kernel knows
};

// Drops every capability outside `keep` from the bounding set, clears the ambient set and sets
// permitted = effective = inheritable = keep. Returns 0 or an errno value, and in *failed_step
// 0 (bounding set), 1 (ambient) or 2 (capset).
int ApplyCaps(const CapsPlan& plan, int* failed_step);

// Drops every capability outside `keep` from the bounding set only (the first step of
// ApplyCaps). Needs CAP_SETPCAP. Returns 0 or an errno value.
int DropBoundingCaps(const CapsPlan& plan);

// Clears the ambient, permitted, effective and inheritable sets (the bounding set stays).
// Needs no capability. Returns 0 or an errno value.
int ClearCaps();

}  // namespace sbx
