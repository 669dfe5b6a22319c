// The sandbox's network namespace. For now it holds only `lo` (no route out); veth and egress
// policy come with the network issue.
#pragma once

namespace sbx::runtime::ns {

// Child side (async-signal-safe): sets IFF_UP on `lo` of the current network namespace with
// SIOCSIFFLAGS on an AF_INET datagram socket. Returns 0 or an errno value.
int BringLoopbackUp();

}  // namespace sbx::runtime::ns
