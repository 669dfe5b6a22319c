// The QEMU driver of the microvm runtime: QEMU's `microvm` machine, its command line, and QMP
// (QEMU's JSON control socket) for what changes a running VM (stop, cont, quit, status).
//
// A VM's devices, all virtio-mmio (the microvm machine has no PCI):
//   - virtio-serial with one port, `sbx.agent`, whose host end is a unix socket QEMU listens on
//     (serial.sock); the bridge (sbx-agent --vm-bridge) connects to it (protocol/mux.h);
//   - virtio-blk: the sandbox's disk (an ext4 image holding the overlay's upper and work);
//   - virtio-9p, read-only: the guest's config (tag sbxcfg), the template's trees (lower0..)
//     and its read-only binds (bind0..);
//   - the serial console (ttyS0) into console.log, where a guest's boot errors and panics land.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace sbx::runtime::microvm {

struct QemuShare {
  std::string tag;
  std::string host_path;
};

struct QemuVm {
  std::string qemu = "qemu-system-x86_64";
  std::string accel = "tcg";  // "kvm" or "tcg"
  int64_t vcpus = 1;
  int64_t memory_mib = 512;
  std::string vmlinux;
  std::string initramfs;
  std::string disk_image;
  std::vector<QemuShare> shares;  // read-only 9p shares
  std::string serial_socket;      // the agent port's host end (QEMU listens)
  std::string qmp_socket;
  std::string console_log;
  std::string extra_cmdline;  // appended to the guest kernel's command line
};

// Kernel parameters a TCG guest needs to boot reliably: under emulation on a loaded host the
// kernel's TSC calibration against the PIT sometimes fails and the boot then hangs after
// "tsc: Marking TSC unstable" (1 boot in 10 here). Giving the TSC's frequency
// (tsc_early_khz, from the host's /proc/cpuinfo: TCG's guest TSC is the host's) and the delay
// loop's (lpj, with the kernel's HZ from its config) skips both calibrations. Empty when the
// host does not say its frequency.
std::string TcgKernelParams(const std::string& cpuinfo, const std::string& kernel_config);

// argv for QEMU (argv[0] is vm.qemu).
std::vector<std::string> QemuArgv(const QemuVm& vm);

// One QMP command on the VM's control socket: connects, negotiates capabilities, runs
// `command` (with `arguments` unless null) and returns its "return" value. Events QEMU sends
// meanwhile are skipped. Unavailable when the socket does not answer within `timeout`.
absl::StatusOr<nlohmann::json> QmpCommand(const std::string& socket, const std::string& command,
                                          const nlohmann::json& arguments = nullptr,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace sbx::runtime::microvm
