// device.loop (the ns runtime's disk caps attach each sandbox's ext4 image to a loop device) and
// device.kvm (whether the microvm runtime gets hardware KVM or falls back to TCG, so never
// required; a 7-byte test guest is run, no Linux guest is booted).
#include <fcntl.h>
#include <linux/kvm.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "common/unique_fd.h"
#include "runtime/doctor/checks.h"

namespace sbx::runtime::doctor {

namespace {

void CheckLoop(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{"device.loop", "loop devices", CheckResult::kOk, "", "", required};
  const std::string ctl_path = "/dev/loop-control";
  if (!ctx.Exists(ctl_path)) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("{} is missing: each sandbox's disk (its disk_mib cap) is an ext4 image "
                           "on a loop device", ctx.Host(ctl_path));
    c.remedy = "modprobe loop (CONFIG_BLK_DEV_LOOP); in a container, pass /dev/loop-control and "
               "the /dev/loopN devices";
    ctx.Add(std::move(c));
    return;
  }
  if (!ctx.live) {
    c.detail = fmt::format("{} present; LOOP_CTL_GET_FREE not tried: fake host root", ctx.Host(ctl_path));
    ctx.Add(std::move(c));
    return;
  }
  UniqueFd ctl(::open(ctl_path.c_str(), O_RDWR | O_CLOEXEC));
  if (!ctl) {
    const int err = errno;
    c.result = CheckResult::kFail;
    c.detail = fmt::format("open({}, O_RDWR): {}", ctl_path, ErrnoText(err));
    c.remedy = err == EACCES || err == EPERM
                   ? "run as root (with CAP_SYS_ADMIN); a container's device cgroup must allow the loop devices"
                   : "check the device node (c 10:237)";
    ctx.Add(std::move(c));
    return;
  }
  // Names a free device (making one if none is free) without attaching anything.
  const int n = ::ioctl(ctl.get(), LOOP_CTL_GET_FREE);
  if (n < 0) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("ioctl({}, LOOP_CTL_GET_FREE): {}", ctl_path, ErrnoText(errno));
    c.remedy = "raise max_loop (loop.max_loop=N on the kernel command line) or free loop devices "
               "(losetup -D detaches unused ones)";
    ctx.Add(std::move(c));
    return;
  }
  const std::string dev = fmt::format("/dev/loop{}", n);
  struct stat st;
  if (::stat(dev.c_str(), &st) != 0 || !S_ISBLK(st.st_mode)) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("LOOP_CTL_GET_FREE named loop{}, but {} is not a block device here", n, dev);
    c.remedy = "/dev needs the loop nodes (devtmpfs does this; a container must pass them)";
  } else {
    c.detail = fmt::format("{} works: LOOP_CTL_GET_FREE -> {}", ctl_path, dev);
  }
  ctx.Add(std::move(c));
}

struct KvmProbe {
  int open_err = 0;
  int api_version = -1;
  int api_err = 0;
  int create_err = 0;
  // The test guest (it crosses the pipe by value): the step that failed (empty: none), its
  // errno, the last KVM exit reason, and the time from the first KVM_RUN to HLT.
  char run_step[32] = {};
  int run_err = 0;
  int exit_reason = -1;
  long run_us = -1;
};

// A 16-bit guest of 7 bytes at 0x1000: `mov dx, 0x3f8; mov al, 'K'; out dx, al; hlt`. It proves
// that a vCPU really executes guest code and exits to us (a port write, then HLT) -- more than
// KVM_CREATE_VM, which a host without usable virtualization also grants. It does not prove that
// a Linux guest boots: PVM runs this one and not a stock kernel.
void RunTinyGuest(int kvm, int vm, KvmProbe* r) {
  auto fail = [&](const char* step) {
    std::snprintf(r->run_step, sizeof(r->run_step), "%s", step);
    r->run_err = errno;
  };
  static constexpr unsigned char kCode[] = {0xba, 0xf8, 0x03, 0xb0, 'K', 0xee, 0xf4};
  constexpr uint64_t kGuestAddr = 0x1000;
  void* mem = ::mmap(nullptr, 0x1000, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return fail("mmap(guest memory)");
  std::memcpy(mem, kCode, sizeof(kCode));
  struct kvm_userspace_memory_region region = {};
  region.guest_phys_addr = kGuestAddr;
  region.memory_size = 0x1000;
  region.userspace_addr = reinterpret_cast<uint64_t>(mem);
  if (::ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) != 0) return fail("KVM_SET_USER_MEMORY_REGION");
  const int vcpu = ::ioctl(vm, KVM_CREATE_VCPU, 0UL);
  if (vcpu < 0) return fail("KVM_CREATE_VCPU");
  const int run_size = ::ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
  if (run_size <= 0) return fail("KVM_GET_VCPU_MMAP_SIZE");
  void* run_map = ::mmap(nullptr, static_cast<size_t>(run_size), PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
  if (run_map == MAP_FAILED) return fail("mmap(vcpu)");
  auto* run = static_cast<struct kvm_run*>(run_map);
  struct kvm_sregs sregs;
  if (::ioctl(vcpu, KVM_GET_SREGS, &sregs) != 0) return fail("KVM_GET_SREGS");
  sregs.cs.base = 0;
  sregs.cs.selector = 0;
  if (::ioctl(vcpu, KVM_SET_SREGS, &sregs) != 0) return fail("KVM_SET_SREGS");
  struct kvm_regs regs = {};
  regs.rip = kGuestAddr;
  regs.rflags = 2;  // bit 1 is reserved and must be set
  if (::ioctl(vcpu, KVM_SET_REGS, &regs) != 0) return fail("KVM_SET_REGS");
  struct timespec t0, t1;
  ::clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int exits = 0; exits < 4; ++exits) {
    if (::ioctl(vcpu, KVM_RUN, 0) != 0) return fail("KVM_RUN");
    r->exit_reason = static_cast<int>(run->exit_reason);
    if (run->exit_reason == KVM_EXIT_IO) continue;  // the 'K' on the serial port
    if (run->exit_reason == KVM_EXIT_HLT) {
      ::clock_gettime(CLOCK_MONOTONIC, &t1);
      r->run_us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    }
    return;
  }
}

// With runtime.default = "microvm" on Firecracker, a KVM that runs no stock guest leaves sbxd
// nothing to start VMs with: QEMU falls back to TCG, Firecracker has no software emulation.
void RequireForFirecracker(const Context& ctx, Check& c) {
  if (!(ctx.microvm && ctx.opts.microvm_vmm == "firecracker")) return;
  c.required = true;
  if (c.result != CheckResult::kWarn) return;
  c.result = CheckResult::kFail;
  c.detail += "; runtime.microvm.vmm = \"firecracker\" needs it (Firecracker has no software emulation)";
  c.remedy = "a host whose KVM runs stock guests (kvm_intel or kvm_amd), or runtime.microvm.vmm = \"qemu\" (TCG)";
}

void CheckKvm(const Context& ctx) {
  if (!ctx.Wants(ctx.microvm && ctx.opts.microvm_vmm == "firecracker")) return;
  Check c{"device.kvm", "KVM (/dev/kvm)", CheckResult::kOk, "", "", false};
  const bool present = ctx.Exists("/dev/kvm");
  const bool intel = ctx.Exists("/sys/module/kvm_intel");
  const bool amd = ctx.Exists("/sys/module/kvm_amd");
  const bool pvm = ctx.Exists("/sys/module/kvm_pvm") && !intel && !amd;
  if (!present) {
    c.result = CheckResult::kWarn;
    c.detail = fmt::format("no {}: no hardware virtualization here; the microvm runtime runs guests "
                           "under TCG (software emulation: seconds per boot; ns and fake need no KVM)",
                           ctx.Host("/dev/kvm"));
    c.remedy = "nothing to do for the ns and fake runtimes; for microvm boots in milliseconds, a "
               "host with hardware KVM (kvm_intel or kvm_amd)";
    RequireForFirecracker(ctx, c);
    ctx.Add(std::move(c));
    return;
  }
  std::string probe;
  bool probe_failed = false;
  if (ctx.live) {
    auto outcome = RunInChild(
        [](int fd) {
          KvmProbe r;
          int kvm = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
          if (kvm < 0) {
            r.open_err = errno;
          } else {
            r.api_version = ::ioctl(kvm, KVM_GET_API_VERSION, 0);
            if (r.api_version < 0) r.api_err = errno;
            // The VM and its one vCPU die with the child.
            int vm = ::ioctl(kvm, KVM_CREATE_VM, 0UL);
            r.create_err = vm < 0 ? errno : 0;
            if (vm >= 0) RunTinyGuest(kvm, vm, &r);
          }
          (void)!::write(fd, &r, sizeof(r));
        },
        ctx.opts.probe_timeout);
    KvmProbe r;
    probe_failed = true;
    if (!outcome.ok()) {
      probe = fmt::format("; probe failed: {}", std::string(outcome.status().message()));
    } else if (outcome->output.size() != sizeof(r)) {
      std::string why = DescribeAbnormal(*outcome, ctx.opts.probe_timeout);
      probe = fmt::format("; probe failed: {}", why.empty() ? "no report" : why);
    } else {
      std::memcpy(&r, outcome->output.data(), sizeof(r));
      probe_failed = r.open_err != 0 || r.api_version < 0 || r.create_err != 0;
      if (r.open_err != 0) {
        probe = fmt::format("; open(/dev/kvm): {}", ErrnoText(r.open_err));
      } else {
        probe = r.api_version >= 0 ? fmt::format("; KVM_GET_API_VERSION {}", r.api_version)
                                   : fmt::format("; KVM_GET_API_VERSION: {}", ErrnoText(r.api_err));
        if (r.create_err != 0) {
          probe += fmt::format(", KVM_CREATE_VM: {}", ErrnoText(r.create_err));
        } else if (r.run_step[0] != '\0') {
          probe_failed = true;
          probe += fmt::format(", KVM_CREATE_VM ok; a 7-byte test guest did not run: {}: {}",
                               std::string(r.run_step, strnlen(r.run_step, sizeof(r.run_step))),
                               ErrnoText(r.run_err));
        } else if (r.run_us < 0) {
          probe_failed = true;
          probe += fmt::format(", KVM_CREATE_VM ok; a 7-byte test guest stopped with KVM exit "
                               "reason {} instead of HLT", r.exit_reason);
        } else {
          probe += fmt::format(", a 7-byte real-mode test guest ran to HLT in {} us", r.run_us);
        }
      }
    }
  } else {
    probe = "; not opened: fake host root";
  }
  if (pvm) {
    c.result = CheckResult::kWarn;
    c.detail = fmt::format("PVM-only KVM: stock guest kernels cannot boot, so the microvm runtime "
                           "runs guests under TCG (software emulation: seconds per boot; kvm_pvm "
                           "loaded, no kvm_intel/kvm_amd{})",
                           probe);
    c.remedy = "nothing to do for the ns and fake runtimes; for microvm boots in milliseconds, a "
               "host with hardware KVM (kvm_intel or kvm_amd)";
  } else {
    if (probe_failed) {
      c.result = CheckResult::kWarn;
      c.remedy = "nothing to do for the ns and fake runtimes; the microvm runtime falls back to "
                 "TCG (software emulation) until /dev/kvm is usable";
    }
    c.detail = fmt::format("present ({}){}; the microvm runtime runs stock guests with KVM here "
                           "(runtime.microvm.accel auto)",
                           intel ? "kvm_intel" : amd ? "kvm_amd" : "vendor module unknown", probe);
  }
  RequireForFirecracker(ctx, c);
  ctx.Add(std::move(c));
}

}  // namespace

void CheckDevices(const Context& ctx) {
  CheckLoop(ctx);
  CheckKvm(ctx);
}

}  // namespace sbx::runtime::doctor
