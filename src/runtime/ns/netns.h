// The sandbox's network namespace. For now it holds only `lo` (no route out); veth and egress
// policy come with the network issue.
#pragma once

namespace sbx::runtime::ns {

// Async-signal-safe (the launch child and the netns pool call it): in the current network
// namespace, sets IFF_UP on `lo` (SIOCSIFFLAGS on an AF_INET datagram socket) and writes 0 to
// net.ipv4.ip_unprivileged_port_start. The latter because the namespace belongs to the host's
// user namespace: sandbox root's CAP_NET_BIND_SERVICE does not count in it, and root inside
// expects to bind :80. Needs host root and the host's (writable) /proc/sys. Returns 0 or an
// errno value; *stage says which: 0 lo, 1 the sysctl.
int PrepareSandboxNetns(int* stage);

}  // namespace sbx::runtime::ns
