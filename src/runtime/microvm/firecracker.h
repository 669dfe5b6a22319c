// The Firecracker driver of the microvm runtime (docs/microvm.md, "Firecracker"): for hosts
// where the operator installed Firecracker's release binaries (`firecracker` and `jailer`) and
// set runtime.microvm.vmm = "firecracker". Firecracker needs KVM (it has no emulator), so on
// hosts without hardware virtualization the runtime says so and stays unavailable.
//
// What differs from QEMU, and how sbx meets it:
//   - Firecracker is configured by a JSON file (--config-file) and driven over its HTTP API on a
//     unix socket (--api-sock): pause and resume are PATCH /vm, suspend is PUT /snapshot/create
//     (a vmstate file and a memory file), wake is a new process and PUT /snapshot/load.
//   - It has no virtio-serial and no 9p: the guest's agent listens on vsock port
//     agent::kGuestVsockPort, reached through Firecracker's unix socket with "CONNECT <port>\n"; disks
//     carry no serial, so the guest finds them by order (kernel parameter sbx.disks=order:
//     config, the sandbox's disk, then the template's trees); templates that bind host
//     directories (`base`) cannot run on it.
//   - Its jailer makes the chroot (<dir>/fc/firecracker/<id>/root), drops to the VMM's uid and
//     execs it; sbx hard-links the VM's files into that root first, and joins the VMM's cgroup
//     before the jailer runs (sbx-agent --vm-jail in its `delegate` mode).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "runtime/microvm/vmm.h"

namespace sbx::runtime::microvm {

// The guest's vsock context id (any above 2; one per VM, but each VM has its own socket).
inline constexpr uint32_t kGuestVsockCid = 3;

struct FirecrackerDrive {
  std::string host_path;  // hard-linked into the chroot as /drive<N>
  bool read_only = true;
};

struct FirecrackerVm {
  std::string firecracker;  // the binary (the jailer copies it into the root under its own name)
  std::string jailer;
  std::string vm_dir;       // <state>/vm/<sandbox id>
  std::string sandbox_id;
  uint32_t uid = 0;         // the VMM's uid and gid
  int64_t vcpus = 1;
  int64_t memory_mib = 256;
  std::string vmlinux;
  std::string initramfs;
  std::string cmdline;      // appended to Firecracker's own console settings
  std::vector<FirecrackerDrive> drives;  // the guest's vda, vdb, ... in this order
  std::string tap;          // empty: no NIC
  std::string mac;
  unsigned long long max_file_bytes = 0;  // RLIMIT_FSIZE of the VMM (its console log, a suspend's files)
};

// The jailer's --id for a sandbox: letters, digits and '-' only, so "sbx_x" is "sbx-x".
std::string JailerId(const std::string& sandbox_id);
// The jailer's chroot of the VM in `vm_dir` (whose last component is the sandbox id).
std::string FirecrackerRoot(const std::string& vm_dir);

// The --config-file document (paths as the jailed VMM sees them).
nlohmann::json FirecrackerConfig(const FirecrackerVm& vm);
// The jailer's command line that boots `vm` (with_config) or starts an empty VMM that a
// snapshot is loaded into (a wake).
std::vector<std::string> JailerArgv(const FirecrackerVm& vm, bool with_config);

// Makes the chroot, hard-links the VM's files into it (owned as the VMM needs them), writes the
// config, and returns the jailer's command line.
absl::StatusOr<std::vector<std::string>> PrepareFirecracker(const FirecrackerVm& vm);

// One request to Firecracker's API socket. The response body (empty for 204), or an error
// with Firecracker's fault_message.
absl::StatusOr<std::string> FirecrackerRequest(const std::string& socket, const std::string& method,
                                               const std::string& path, const nlohmann::json& body,
                                               std::chrono::milliseconds timeout);

std::unique_ptr<Vmm> NewFirecrackerVmm(const std::string& vm_dir);

}  // namespace sbx::runtime::microvm
