// The VMM drivers of the microvm runtime behind one small interface (docs/microvm.md, "VMM
// drivers"): what a running VM's instance asks of the process that runs it. QEMU's `microvm`
// machine over QMP (qemu.*) and Firecracker over its HTTP API (firecracker.*) implement it; a
// VM's record (vm.json) names its driver, so an sbxd restarted with another default still
// drives the VMs it adopts with theirs.
//
// How a VMM is started (its command line, its jail) is the backend's, per driver; the driver
// only talks to a VMM that runs, through the files of the VM's directory it was given.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace sbx::runtime::microvm {

// The unix socket through which the host bridge reaches the guest's agent, and the line it
// writes first (Firecracker's vsock: "CONNECT <port>\n", answered "OK <n>\n"; QEMU: none).
struct GuestLink {
  std::string socket;
  std::string connect_line;
};

// A VMM that loads a saved state: its command line, and a descriptor it inherits as fd 3
// (invalid: none).
struct RestoreStart {
  std::vector<std::string> argv;
  UniqueFd fd3;
};

class Vmm {
 public:
  virtual ~Vmm() = default;
  virtual std::string Name() const = 0;  // "qemu", "firecracker"

  // The vCPUs stop (memory stays resident) / go on; whether they run.
  virtual absl::Status Pause() const = 0;
  virtual absl::Status Continue() const = 0;
  virtual absl::StatusOr<bool> Running() const = 0;

  // Writes the paused VM's whole state (memory, vCPUs, devices) to `state` (a path in the VM's
  // directory; the driver may add files beside it, named `state.*`), fsynced, and returns the
  // bytes it takes. The VMM still runs afterwards: Quit ends it.
  virtual absl::StatusOr<int64_t> Save(const std::string& state, std::chrono::seconds timeout) const = 0;
  virtual void Quit() const = 0;

  // A wake: how to start a VMM (from the command line that booted the VM) that loads `state`.
  virtual absl::StatusOr<RestoreStart> Restore(const std::vector<std::string>& boot_argv,
                                               const std::string& state) const = 0;
  // After that process started: until the state is loaded and the VM waits, paused, for
  // Continue. `alive` is OK while the process runs, otherwise why it ended.
  virtual absl::Status AwaitLoaded(const std::string& state, const std::function<absl::Status()>& alive,
                                   std::chrono::steady_clock::time_point deadline) const = 0;

  virtual GuestLink Link() const = 0;
};

// The driver `name` ("qemu" or "firecracker") of the VM whose directory is `vm_dir`.
absl::StatusOr<std::unique_ptr<Vmm>> OpenVmm(const std::string& name, const std::string& vm_dir);

}  // namespace sbx::runtime::microvm
