// A microVM's host side: the record kept beside it (vm.json), its processes (QEMU and the
// agent bridge, each leading a session of its own), and the runtime::Instance that pauses,
// suspends, wakes, dials and destroys it (docs/microvm.md).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/sandbox_net.h"
#include "runtime/backend.h"
#include "runtime/microvm/vmm.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::microvm {

// The last `n` bytes of `s` / of a log file (read from its end: a guest may have written any
// amount to its console), trailing newlines dropped.
std::string Tail(const std::string& s, size_t n);
std::string FileTail(const std::string& path, size_t n);

// The process `pid` is alive (not a zombie) and its command line names `dir`: guards every
// kill of a pid read from a file against pid reuse.
bool IsOurs(pid_t pid, const std::string& dir);
// Kills `pid` (and its process group) if it is still ours, and waits until it is gone.
void Stop(pid_t pid, const std::string& dir);
// Whether `pid` still runs; `*ended` says how, once this process reaped it.
bool Alive(pid_t pid, const std::string& dir, std::string* ended = nullptr);

// vm.json, the VM's record beside it: what adoption, delete and the sweep need after sbxd
// restarts, and what a wake from suspend needs to start QEMU again with the same devices.
struct VmRecord {
  std::string vmm = "qemu";  // the VMM's driver (vmm.h)
  pid_t vmm_pid = 0;
  pid_t bridge = 0;
  bool suspended = false;   // the state is in <dir>/state, no process runs
  bool migratable = false;  // no 9p share: suspend can save the VM
  // How the VMM starts, through its jail (QEMU: sbx-agent --vm-jail <dir>/jail.json -- QEMU
  // ...), so that a wake runs it again as its driver's Restore says.
  std::vector<std::string> vmm_argv;
  uint32_t uid = 0;  // the VMM's uid and gid: the base of a claimed uid range (0: none claimed)
  int64_t vcpus = 1, memory_mib = 0;  // for the VMM's cgroup limits, made again on a wake after a reboot
  // A template build step's VM (SandboxSpec::keep_writable_layer): ExportWritableLayer works,
  // its stream bounded by the disk. Not in vm.json: a build step's VM is never adopted.
  bool keep_writable_layer = false;
  int64_t disk_mib = 0;
};

absl::StatusOr<VmRecord> ReadRecord(const std::string& dir);
absl::Status WriteRecord(const std::string& dir, const VmRecord& r);

// `agent --vm-bridge <link.socket> <dir>/agent.sock [CONNECT-LINE] [--as-uid UID]`, detached,
// logging to bridge.log; confined to the VMM's uid (0: none claimed, not confined) once its
// sockets are open, before it parses what the guest sends.
absl::StatusOr<pid_t> StartBridge(const std::string& agent, const std::string& dir, const GuestLink& link,
                                  uint32_t uid);
// Where the VMM of `rec` logs (its stderr): <dir>/<driver>.log.
std::string VmmLog(const std::string& dir, const VmRecord& rec);
// Until the guest's agent answers through the bridge; a VM that exits first says why.
absl::Status WaitForAgent(const Instance& vm, const std::string& dir, int timeout_s, const std::string& accel);

// What a resumed VM needs from its backend.
struct ResumeContext {
  std::string agent_path;
  int boot_timeout_s = 60;
  std::string accel;
  net::NetworkHost* network = nullptr;
  ns::UidRanges* uids = nullptr;  // where the VMM's uid is claimed; Destroy releases it
  ns::CgroupDriver* cgroups = nullptr;  // the VMMs' cgroups (VmCgroupLimits)
};

// The VMM's cgroup: the guest's memory plus what QEMU needs beside it (TCG's code cache,
// device emulation, I/O threads), its vCPUs plus half a CPU for device emulation.
ns::CgroupLimits VmCgroupLimits(int64_t vcpus, int64_t memory_mib);

// NotFound when the record names a VMM driver this sbx does not have.
absl::StatusOr<InstancePtr> NewMicrovmInstance(std::string id, std::string dir, VmRecord rec, ResumeContext ctx,
                                               std::unique_ptr<net::SandboxNetwork> network);

}  // namespace sbx::runtime::microvm
