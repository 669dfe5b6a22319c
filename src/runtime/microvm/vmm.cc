#include "runtime/microvm/vmm.h"

#include <fmt/format.h>

#include "runtime/microvm/firecracker.h"
#include "runtime/microvm/qemu.h"

namespace sbx::runtime::microvm {

absl::StatusOr<std::unique_ptr<Vmm>> OpenVmm(const std::string& name, const std::string& vm_dir) {
  if (name == "qemu") return NewQemuVmm(vm_dir);
  if (name == "firecracker") return NewFirecrackerVmm(vm_dir);
  return absl::NotFoundError(fmt::format("{}: no VMM driver \"{}\" (qemu, firecracker)", vm_dir, name));
}

}  // namespace sbx::runtime::microvm
