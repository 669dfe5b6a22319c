// A persistent tap device on the host: the microvm runtime's NIC (docs/microvm.md,
// "Networking"). It takes the place of a sandbox's veth pair: the host end, its addresses and
// its nftables elements are the same, so egress rules and port exposure apply unchanged, and
// the guest's virtio-net holds the sandbox end's addresses. Persistent, so it outlives the VMM
// across a suspend and an sbxd restart; removed with RTM_DELLINK like a veth.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace sbx::net {

// Creates tap `name` (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, as QEMU opens it) and makes it persist
// after the creating fd closes. AlreadyExists when a link of that name exists. `owner` (not 0)
// may open it later without CAP_NET_ADMIN.
absl::Status CreatePersistentTap(const std::string& name, uint32_t owner = 0);

}  // namespace sbx::net
