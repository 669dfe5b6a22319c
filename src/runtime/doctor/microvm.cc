// microvm.* (what the microvm runtime needs besides /dev/kvm, which device.kvm reports): QEMU
// and a guest kernel. Never required: sbxd offers microvm beside the default runtime only where
// these rows are ok, and GET /v1/runtimes gives the same reason when it does not.
#include <sys/stat.h>

#include <fmt/format.h>

#include "common/process.h"
#include "runtime/doctor/checks.h"
#include "runtime/microvm/boot_assets.h"

namespace sbx::runtime::doctor {

void CheckMicrovm(const Context& ctx) {
  if (!ctx.Wants(false)) return;
  {
    Check c{"microvm.qemu", "QEMU for microVMs", CheckResult::kOk, "", "", false};
    const std::string name = ctx.opts.microvm_qemu.empty() ? "qemu-system-x86_64" : ctx.opts.microvm_qemu;
    absl::StatusOr<std::string> path = absl::NotFoundError("fake host root");
    if (ctx.live) {
      path = FindProgram(name);
    } else if (ctx.Exists("/usr/bin/" + name)) {
      path = "/usr/bin/" + name;
    }
    if (path.ok()) {
      c.detail = fmt::format("{} (runtime.microvm.qemu)", *path);
    } else {
      c.result = CheckResult::kWarn;
      c.detail = fmt::format("no {}: {}; the microvm runtime is unavailable", name, std::string(path.status().message()));
      c.remedy = "apt-get install qemu-system-x86 (or set runtime.microvm.qemu); nothing to do for ns";
    }
    ctx.Add(std::move(c));
  }
  {
    Check c{"microvm.kernel", "guest kernel", CheckResult::kOk, "", "", false};
    if (!ctx.opts.microvm_kernel.empty()) {
      struct stat st;
      if (::stat(ctx.Host(ctx.opts.microvm_kernel).c_str(), &st) == 0) {
        c.detail = fmt::format("{} (runtime.microvm.kernel)", ctx.opts.microvm_kernel);
      } else {
        c.result = CheckResult::kWarn;
        c.detail = fmt::format("runtime.microvm.kernel {} is missing", ctx.opts.microvm_kernel);
        c.remedy = "point runtime.microvm.kernel at a bzImage or vmlinux, or leave it empty";
      }
    } else if (auto k = microvm::FindKernel(ctx.Host("/boot")); k.ok()) {
      c.detail = fmt::format("{}: its modules and an initramfs with sbx-agent are prepared at the "
                             "first microvm create and cached by content",
                             *k);
    } else {
      c.result = CheckResult::kWarn;
      c.detail = fmt::format("no /boot/vmlinuz-*: {}", std::string(k.status().message()));
      c.remedy = "apt-get install linux-image-amd64 (the guest kernel; the host need not boot it)";
    }
    ctx.Add(std::move(c));
  }
}

}  // namespace sbx::runtime::doctor
