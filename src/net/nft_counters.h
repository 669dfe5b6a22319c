// One sandbox's denial counters read straight from the kernel: one NFT_MSG_GETSETELEM per
// reason for the sandbox's element alone, over a netfilter netlink socket (libmnl).
//
// libnftables cannot do this cheaply: before `get element` it reads the whole set into its
// cache, so one sandbox's 17 counters cost 17 set dumps (measured: 19 ms for two elements of
// a 3,000-element set). sbxd reads a sandbox's counters at every delete (the last reading of
// sbx_egress_denied_total) and for GET /v1/sandboxes/{id}/egress: that must not grow with the
// number of sandboxes.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "net/nft.h"

namespace sbx::net {

// The counters of veth `veth` in every deny_REASON set of sbx's table, in the calling
// thread's network namespace. NotFound when the veth has no element (no such sandbox).
absl::StatusOr<DenialCounts> ReadVethCounters(const std::string& veth);

}  // namespace sbx::net
