// The QEMU driver of the microvm runtime: QEMU's `microvm` machine, its command line, and QMP
// (QEMU's JSON control socket) for what changes a running VM (stop, cont, quit, status).
//
// A VM's devices, all virtio-mmio (the microvm machine has no PCI):
//   - virtio-serial with one port, `sbx.agent`, whose host end is a unix socket QEMU listens on
//     (serial.sock); the bridge (sbx-agent --vm-bridge) connects to it (protocol/mux.h);
//   - virtio-blk, each known to the guest by its serial: the guest's config (sbxcfg, read-only),
//     the sandbox's disk (sbxdisk: an ext4 image holding the overlay's upper and work) and the
//     template's trees as read-only ext4 images (sbxl0..);
//   - virtio-9p, read-only: what is not an image (a template's binds of host directories).
//     QEMU refuses to migrate a VM with a 9p share mounted, so such a VM's suspend is a pause.
//   - the serial console (ttyS0) into console.log, where a guest's boot errors and panics land.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "runtime/microvm/vmm.h"

namespace sbx::runtime::microvm {

struct QemuShare {
  std::string tag;
  std::string host_path;
};

struct QemuDisk {
  std::string path;
  std::string serial;  // what the guest finds it by (/sys/block/vdX/serial), <= 20 bytes
  bool read_only = true;
};

struct QemuVm {
  std::string qemu = "qemu-system-x86_64";
  std::string accel = "tcg";  // "kvm" or "tcg"
  int64_t vcpus = 1;
  int64_t memory_mib = 512;
  std::string vmlinux;
  std::string initramfs;
  std::vector<QemuDisk> disks;
  std::vector<QemuShare> shares;  // read-only 9p shares
  std::string tap;                // the host's tap for the VM's virtio-net NIC (empty: no NIC);
                                  // QEMU gets it open as fd 4 (agent/vm_jail.h)
  std::string mac;
  std::string serial_socket;      // the agent port's host end (QEMU listens)
  std::string qmp_socket;
  std::string console_log;
  std::string extra_cmdline;  // appended to the guest kernel's command line
  // Wake from suspend: QEMU reads the VM's saved state from its fd 3 (a migration stream) and
  // waits, stopped, for `cont`.
  bool incoming_fd3 = false;
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

// Writes the stopped VM's whole state (memory, devices) to `fd` with QMP `getfd` (the fd goes
// over the socket with SCM_RIGHTS) and `migrate fd:`, and waits until QEMU says completed.
// Returns QEMU's final migration statistics (query-migrate). The VM must be stopped already.
absl::StatusOr<nlohmann::json> QmpSaveState(const std::string& socket, int fd,
                                            std::chrono::milliseconds timeout);

// The QEMU driver of the VM in `vm_dir` (QMP on vmm/qmp.sock, the agent's port on
// vmm/serial.sock).
std::unique_ptr<Vmm> NewQemuVmm(const std::string& vm_dir);

}  // namespace sbx::runtime::microvm
