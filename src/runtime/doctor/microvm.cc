// microvm.* (what the microvm runtime needs besides /dev/kvm, which device.kvm reports): its
// VMM (QEMU, or Firecracker and its jailer with runtime.microvm.vmm = "firecracker") and a
// guest kernel. Required only when microvm is the runtime checked for (runtime.default =
// "microvm"); otherwise sbxd offers microvm beside the default runtime only where these rows are
// ok, and GET /v1/runtimes gives the same reason when it does not.
#include <sys/stat.h>

#include <fmt/format.h>

#include "common/process.h"
#include "runtime/doctor/checks.h"
#include "runtime/microvm/boot_assets.h"

namespace sbx::runtime::doctor {

void CheckMicrovm(const Context& ctx) {
  if (!ctx.Wants(ctx.microvm)) return;
  // Without them the default runtime cannot start; beside ns they only withhold microvm.
  const CheckResult missing = ctx.microvm ? CheckResult::kFail : CheckResult::kWarn;
  const std::string unavailable = ctx.microvm ? "sbxd cannot start on runtime microvm"
                                              : "the microvm runtime is unavailable";
  if (ctx.opts.microvm_vmm == "firecracker") {
    // Firecracker's release binaries, which the operator installs (docs/microvm.md).
    Check c{"microvm.firecracker", "Firecracker and its jailer", CheckResult::kOk, "", "", ctx.microvm};
    std::string found, absent;
    for (const std::string& name : {ctx.opts.microvm_firecracker, ctx.opts.microvm_jailer}) {
      absl::StatusOr<std::string> path = absl::NotFoundError("fake host root");
      if (ctx.live) {
        path = FindProgram(name);
      } else if (ctx.Exists(name.starts_with("/") ? name : "/usr/local/bin/" + name)) {
        path = name.starts_with("/") ? name : "/usr/local/bin/" + name;
      }
      if (path.ok()) {
        found += (found.empty() ? "" : ", ") + *path;
      } else {
        absent += fmt::format("{}no {}: {}", absent.empty() ? "" : "; ", name, std::string(path.status().message()));
      }
    }
    if (absent.empty()) {
      c.detail = fmt::format("{} (runtime.microvm.firecracker, runtime.microvm.jailer)", found);
    } else {
      c.result = missing;
      c.detail = fmt::format("{}; {}", absent, unavailable);
      c.remedy = "install Firecracker's release binaries (docs/microvm.md, \"Firecracker\") and set "
                 "runtime.microvm.firecracker and .jailer, or runtime.microvm.vmm = \"qemu\"";
    }
    ctx.Add(std::move(c));
  } else {
    Check c{"microvm.qemu", "QEMU for microVMs", CheckResult::kOk, "", "", ctx.microvm};
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
      c.result = missing;
      c.detail = fmt::format("no {}: {}; {}", name, std::string(path.status().message()), unavailable);
      c.remedy = ctx.microvm ? "apt-get install qemu-system-x86 (or set runtime.microvm.qemu)"
                             : "apt-get install qemu-system-x86 (or set runtime.microvm.qemu); "
                               "nothing to do for ns";
    }
    ctx.Add(std::move(c));
  }
  {
    Check c{"microvm.kernel", "guest kernel", CheckResult::kOk, "", "", ctx.microvm};
    if (!ctx.opts.microvm_kernel.empty()) {
      struct stat st;
      if (::stat(ctx.Host(ctx.opts.microvm_kernel).c_str(), &st) == 0) {
        c.detail = fmt::format("{} (runtime.microvm.kernel)", ctx.opts.microvm_kernel);
      } else {
        c.result = missing;
        c.detail = fmt::format("runtime.microvm.kernel {} is missing; {}", ctx.opts.microvm_kernel,
                               unavailable);
        c.remedy = "point runtime.microvm.kernel at a bzImage or vmlinux, or leave it empty";
      }
    } else if (auto k = microvm::FindKernel(ctx.Host("/boot")); k.ok()) {
      c.detail = fmt::format("{}: its modules and an initramfs with sbx-agent are prepared at the "
                             "first microvm create and cached by content",
                             *k);
    } else {
      c.result = missing;
      c.detail = fmt::format("no /boot/vmlinuz-*: {}; {}", std::string(k.status().message()), unavailable);
      c.remedy = "apt-get install linux-image-amd64 (the guest kernel; the host need not boot it)";
    }
    ctx.Add(std::move(c));
  }
}

}  // namespace sbx::runtime::doctor
