// The two microVM roles of the sbx-agent binary (docs/microvm.md):
//   - the guest's init: PID 1 of the initramfs the microvm runtime builds. It loads the
//     virtio modules, builds the sandbox's root (the template's read-only shares under the
//     sandbox's disk, overlaid), moves into it, forks the guest mux pump on the virtio-serial
//     port (QEMU) or on each connection to its vsock port (Firecracker) and becomes the agent;
//   - the host bridge: one process per VM, outside sbxd so that a `kill -9` of sbxd leaves it
//     serving; it listens on the sandbox's agent.sock and carries each connection over QEMU's
//     end of the port (protocol/mux.h).
#pragma once

#include <string>

namespace sbx::agent {

// Never returns when it works (the process becomes the agent); on failure it says why on the
// console and powers the VM off, so that the host sees the VMM exit with the reason in its log.
int RunVmInit();

// Connects to `port_path` (QEMU's chardev socket, or Firecracker's vsock socket, to which it
// first writes `connect_line`; retried while the VMM and the guest start), listens on
// `listen_path` and relays until the VM is gone. With `as_uid`, confined to it once the
// sockets are open (vm_jail.h, ConfineBridge; its empty root is `<listen dir>/bridge-root`).
// Returns the process's exit code.
int RunVmBridge(const std::string& port_path, const std::string& listen_path,
                const std::string& connect_line = "", uint32_t as_uid = 0);

// The virtio disks' serials: the guest config the runtime writes (JSON, zero-padded) and the
// sandbox's own disk. Template trees are disks `sbxl<N>` or 9p shares (config.json, "lowers").
inline constexpr const char* kGuestConfigSerial = "sbxcfg";
inline constexpr const char* kGuestDiskSerial = "sbxdisk";
inline constexpr const char* kGuestPortName = "sbx.agent";
inline constexpr const char* kGuestAgentSocket = "/run/sbx/agent.sock";
// The host bridge's second listener, beside the agent's socket: port streams (protocol/mux.h).
inline constexpr const char* kBridgePortsSocket = "ports.sock";
// The guest's agent link under Firecracker (config "agent_link": "vsock"): this vsock port.
inline constexpr unsigned kGuestVsockPort = 1024;

}  // namespace sbx::agent
