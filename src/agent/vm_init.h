// The two microVM roles of the sbx-agent binary (docs/microvm.md):
//   - the guest's init: PID 1 of the initramfs the microvm runtime builds. It loads the
//     virtio modules, builds the sandbox's root (the template's read-only shares under the
//     sandbox's disk, overlaid), moves into it, forks the guest mux pump on the virtio-serial
//     port and becomes the agent;
//   - the host bridge: one process per VM, outside sbxd so that a `kill -9` of sbxd leaves it
//     serving; it listens on the sandbox's agent.sock and carries each connection over QEMU's
//     end of the port (protocol/mux.h).
#pragma once

#include <string>

namespace sbx::agent {

// Never returns when it works (the process becomes the agent); on failure it says why on the
// console and powers the VM off, so that the host sees the VMM exit with the reason in its log.
int RunVmInit();

// Connects to `port_path` (QEMU's chardev socket; retried while QEMU starts), listens on
// `listen_path` and relays until the VM is gone. Returns the process's exit code.
int RunVmBridge(const std::string& port_path, const std::string& listen_path);

// The guest config the runtime writes (config.json on the `sbxcfg` share); exposed for tests.
inline constexpr const char* kGuestConfigTag = "sbxcfg";
inline constexpr const char* kGuestPortName = "sbx.agent";
inline constexpr const char* kGuestAgentSocket = "/run/sbx/agent.sock";

}  // namespace sbx::agent
