// MicrovmBackend: every sandbox in its own microVM (QEMU, or Firecracker where the operator
// installed it: vmm.h), so a guest kernel, not the host's
// namespaces, is the boundary (docs/microvm.md). The agent inside speaks the same protocol;
// sbxd reaches it through the VM's host bridge on <state>/vm/<id>/agent.sock, as it reaches
// the ns runtime's agent, so nothing above the Backend interface knows the difference.
//
// Layout of a sandbox: <state>/vm/<id>/
//   guest.cfg           what the guest's init builds (JSON on a read-only raw disk, `sbxcfg`)
//   jail.json, jail/    the VMM's jail: its spec and its (empty, on the host) root
//   vmm/                the VMM's own directory (its uid's), the only writable path in its jail:
//     disk.img          the writable layer: a sparse copy of the golden ext4 image of its size
//     serial.sock       the agent port's host end (QEMU listens; the bridge connects)
//     qmp.sock          QEMU's control socket
//     console.log       the guest's serial console
//   agent.sock          the bridge's listener (sbxd connects)
//   qemu.log, bridge.log
//   state               while suspended: the VM's saved state (a QEMU migration stream)
//   vm.json             pids, QEMU's command line, uid, suspended: what Adopt, Remove, Sweep
//                       and a wake act on
// QEMU and the bridge each lead a session of their own, outside sbxd's, so that a `kill -9`
// of sbxd leaves the VM serving and the next sbxd adopts it.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "runtime/backend.h"
#include "net/sandbox_net.h"
#include "runtime/microvm/boot_assets.h"
#include "runtime/microvm/qemu.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::microvm {

struct MicrovmOptions {
  std::string state_dir;
  std::string agent_path;    // the static sbx-agent: the guest's init and the host bridge
  // What the initramfs carries: agent_path + "-guest" (the build's copy without debug
  // sections) when it exists, else agent_path.
  std::string vmm = "qemu";  // the driver of new VMs: qemu | firecracker (vmm.h)
  std::string qemu = "qemu-system-x86_64";
  std::string firecracker = "firecracker";  // Firecracker's release binaries (vmm = firecracker)
  std::string jailer = "jailer";
  std::string kernel;        // empty: the newest /boot/vmlinuz-*
  std::string accel = "auto";  // auto | kvm | tcg
  int boot_timeout_s = 120;  // TCG boots take seconds; a loaded 2-core host, more
  size_t agent_buffer_bytes = 0;
  // sbxd's networking (null: off). A networked sandbox's NIC is a tap in its place
  // (NetworkHost::AttachTap): the same addresses, nftables elements and resolver as a veth.
  net::NetworkHost* network = nullptr;
};

// The least memory a guest boots with: the Debian kernel plus the initramfs.
inline constexpr int64_t kMinGuestMemoryMib = 128;
// The VMMs' cgroups: this parent in every hierarchy, one directory per sandbox id.
inline constexpr char kVmCgroupParent[] = "/sbx-vm";

class MicrovmBackend : public Backend {
 public:
  explicit MicrovmBackend(MicrovmOptions opts);

  std::string Name() const override { return "microvm"; }
  Capabilities GetCapabilities() const override {
    return Capabilities{.pause = true,
                        .suspend_releases_memory = true,
                        .egress_policy = opts_.network != nullptr,
                        .template_builds = true};
  }
  absl::Status Probe() override;
  absl::Status CheckCreate(const Resources& effective, bool networked) const override;
  Json Describe() const override;
  absl::StatusOr<InstancePtr> Create(const SandboxSpec& spec) override;
  absl::StatusOr<InstancePtr> Adopt(const std::string& id, const Json& persisted) override;
  absl::Status Remove(const std::string& id) override;
  absl::Status Sweep(const std::set<std::string>& known_ids) override;

  // "kvm" or "tcg", as Probe() resolved runtime.microvm.accel, with the reason for the choice.
  const std::string& accel() const { return accel_; }
  const std::string& accel_reason() const { return accel_reason_; }

 private:
  // The command line of a new VM's VMM under its jail (vm.json's vmm_argv), per driver.
  absl::StatusOr<std::vector<std::string>> QemuLaunch(const std::string& dir, const QemuVm& vm,
                                                      const SandboxSpec& spec, const std::vector<std::string>& cgroup_procs,
                                                      uint32_t uid);
  absl::StatusOr<std::vector<std::string>> FirecrackerLaunch(const std::string& dir, const QemuVm& vm,
                                                             const SandboxSpec& spec,
                                                             const std::vector<std::string>& cgroup_procs, uint32_t uid);

  std::string SandboxDir(const std::string& id) const;
  absl::StatusOr<BootAssets> Assets();
  absl::StatusOr<std::string> DiskImage(int64_t size_mib, const std::string& dest);

  MicrovmOptions opts_;
  std::string qemu_path_;  // resolved by Probe (vmm qemu)
  std::string firecracker_path_, jailer_path_;  // resolved by Probe (vmm firecracker)
  std::string accel_ = "tcg";
  std::string accel_reason_;
  std::string extra_cmdline_;  // TcgKernelParams under TCG
  std::mutex mu_;  // guards assets_ and the making of golden disk images
  std::optional<BootAssets> assets_;
  // Each VMM's uid and gid: a range claimed host-wide, beside the ns runtime's sandboxes.
  ns::UidRanges uids_;
  // The VMMs' cgroups: <root of each hierarchy>/sbx-vm/<sandbox id>, apart from the ns runtime's
  // (whose sweep would otherwise take them for its own leftovers).
  std::unique_ptr<ns::CgroupDriver> cgroups_;
};

}  // namespace sbx::runtime::microvm
