#include "runtime/microvm/microvm_backend.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/files.h"
#include "common/ids.h"
#include "common/process.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"
#include "agent/vm_init.h"
#include "runtime/microvm/host_view.h"
#include "runtime/microvm/firecracker.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/tree_image.h"
#include "protocol/jail_spec.h"
#include "runtime/microvm/vm_instance.h"
#include "net/dns_policy.h"
#include "net/profiles.h"
#include "runtime/ns/disk_image.h"
#include "runtime/ns/ns_network.h"

namespace sbx::runtime::microvm {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr char kDefaultPath[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// Whether an ELF file asks for a dynamic loader (PT_INTERP): the guest has no libraries.
absl::StatusOr<bool> IsStaticElf(const std::string& path) {
  SBX_ASSIGN_OR_RETURN(std::string b, ReadFileToString(path));
  if (b.size() < sizeof(Elf64_Ehdr) || b.compare(0, 4, ELFMAG) != 0 || b[EI_CLASS] != ELFCLASS64) {
    return absl::FailedPreconditionError(fmt::format("{} is not a 64-bit ELF file", path));
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, b.data(), sizeof(eh));
  for (size_t i = 0; i < eh.e_phnum; ++i) {
    const size_t off = eh.e_phoff + i * eh.e_phentsize;
    if (off + sizeof(Elf64_Phdr) > b.size()) break;
    Elf64_Phdr ph;
    std::memcpy(&ph, b.data() + off, sizeof(ph));
    if (ph.p_type == PT_INTERP) return false;
  }
  return true;
}

}  // namespace

MicrovmBackend::MicrovmBackend(MicrovmOptions opts) : opts_(std::move(opts)) {}

std::string MicrovmBackend::SandboxDir(const std::string& id) const {
  return fmt::format("{}/vm/{}", opts_.state_dir, id);
}

absl::Status MicrovmBackend::Probe() {
  if (opts_.vmm == "firecracker") {
    // Firecracker's release binaries, installed by the operator (docs/microvm.md, "Firecracker").
    auto fc = FindProgram(opts_.firecracker);
    if (!fc.ok()) {
      return Annotate(fc.status(), "microvm: no Firecracker (install its release binaries and set "
                                   "runtime.microvm.firecracker, or runtime.microvm.vmm = \"qemu\")");
    }
    auto jailer = FindProgram(opts_.jailer);
    if (!jailer.ok()) {
      return Annotate(jailer.status(), "microvm: no Firecracker jailer (it ships beside firecracker; set "
                                       "runtime.microvm.jailer)");
    }
    firecracker_path_ = *fc;
    jailer_path_ = *jailer;
  } else if (opts_.vmm == "qemu") {
    auto qemu = FindProgram(opts_.qemu);
    if (!qemu.ok()) {
      return Annotate(qemu.status(),
                      "microvm: no QEMU (apt-get install qemu-system-x86, or set runtime.microvm.qemu)");
    }
    qemu_path_ = *qemu;
  } else {
    return absl::InvalidArgumentError(fmt::format("microvm: unknown VMM \"{}\" (qemu, firecracker)", opts_.vmm));
  }
  if (opts_.kernel.empty()) {
    SBX_RETURN_IF_ERROR(Annotate(FindKernel().status(), "microvm"));
  } else if (::access(opts_.kernel.c_str(), R_OK) != 0) {
    return ErrnoStatus(errno, fmt::format("microvm: guest kernel: access({})", opts_.kernel));
  }
  auto is_static = IsStaticElf(opts_.agent_path);
  if (!is_static.ok()) return Annotate(is_static.status(), "microvm: the guest agent");
  if (!*is_static) {
    return absl::FailedPreconditionError(fmt::format(
        "microvm: {} is linked dynamically; the guest has no libraries (build with "
        "SBX_AGENT_STATIC=ON, without sanitizers)",
        opts_.agent_path));
  }
  if (auto mke2fs = FindProgram("mke2fs"); !mke2fs.ok()) {
    return Annotate(mke2fs.status(), "microvm: disks need mke2fs (apt-get install e2fsprogs)");
  }
  // KVM boots stock guests only where the CPU shows hardware virtualization to this kernel. A
  // paravirtual (PVM) /dev/kvm, as on these CI machines, runs only PVM-aware guests
  // (research/feasibility.md, row 8b), so `auto` takes TCG there.
  const bool kvm_dev = ::access("/dev/kvm", R_OK | W_OK) == 0;
  const std::string cpuinfo = ReadFileOrEmpty("/proc/cpuinfo");
  const bool hw_virt = cpuinfo.find(" vmx") != std::string::npos || cpuinfo.find(" svm") != std::string::npos;
  if (opts_.accel == "kvm") {
    if (!kvm_dev) return absl::FailedPreconditionError("microvm: runtime.microvm.accel = kvm but /dev/kvm is not usable");
    accel_ = "kvm";
    accel_reason_ = "runtime.microvm.accel = kvm";
  } else if (opts_.accel == "tcg") {
    accel_ = "tcg";
    accel_reason_ = "runtime.microvm.accel = tcg (software emulation: boots take seconds)";
  } else if (kvm_dev && hw_virt) {
    accel_ = "kvm";
    accel_reason_ = "/dev/kvm with hardware virtualization";
  } else {
    accel_ = "tcg";
    accel_reason_ = kvm_dev ? "/dev/kvm exists but the CPU shows no vmx/svm (a paravirtual KVM "
                              "runs no stock guest): software emulation, boots take seconds"
                            : "no /dev/kvm: software emulation, boots take seconds";
  }
  if (opts_.vmm == "firecracker" && accel_ != "kvm") {
    return absl::FailedPreconditionError(fmt::format(
        "microvm: Firecracker needs KVM that runs stock guests (it emulates no CPU); this host: {}",
        accel_reason_));
  }
  if (accel_ == "tcg") {
    std::string config;
    if (auto kernel = opts_.kernel.empty() ? FindKernel() : absl::StatusOr<std::string>(opts_.kernel); kernel.ok()) {
      const std::string base = kernel->substr(kernel->rfind('/') + 1);
      if (base.rfind("vmlinuz-", 0) == 0) {
        config = ReadFileOrEmpty(kernel->substr(0, kernel->rfind('/') + 1) + "config-" + base.substr(8));
      }
    }
    extra_cmdline_ = TcgKernelParams(cpuinfo, "\n" + config);
  }
  std::error_code ec;
  fs::create_directories(opts_.state_dir + "/vm", ec);
  if (ec) return absl::InternalError(fmt::format("microvm: mkdir {}/vm: {}", opts_.state_dir, ec.message()));
  SBX_RETURN_IF_ERROR(Annotate(uids_.Init(), "microvm: the VMMs' uids"));
  if (!cgroups_) {
    ns::CgroupEnv env;
    env.parent = kVmCgroupParent;
    auto driver = ns::MakeCgroupDriver(env);
    if (!driver.ok()) return Annotate(driver.status(), "microvm: the VMMs' cgroups");
    SBX_RETURN_IF_ERROR(Annotate((*driver)->Setup(), "microvm: the VMMs' cgroups"));
    SBX_RETURN_IF_ERROR(Annotate((*driver)->CheckLimits(VmCgroupLimits(1, kMinGuestMemoryMib)), "microvm: the VMMs' cgroups"));
    cgroups_ = std::move(*driver);
  }
  return absl::OkStatus();
}

absl::Status MicrovmBackend::CheckCreate(const Resources& effective, bool networked) const {
  if (networked && opts_.network == nullptr) {
    return absl::FailedPreconditionError(
        "microvm: a networked egress profile needs networking, which this sbxd has off (egress.enabled)");
  }
  if (effective.memory_mib < kMinGuestMemoryMib) {
    return absl::InvalidArgumentError(fmt::format(
        "resources.memory_mib: a microVM needs at least {} MiB (its kernel and initramfs), got {}",
        kMinGuestMemoryMib, effective.memory_mib));
  }
  return ns::ValidateDiskMib(static_cast<int>(effective.disk_mib));
}

Json MicrovmBackend::Describe() const {
  return Json{{"vmm", opts_.vmm}, {"accel", accel_}, {"accel_reason", accel_reason_},
              {"min_memory_mib", kMinGuestMemoryMib}, {"kernel_params", extra_cmdline_}};
}

absl::StatusOr<BootAssets> MicrovmBackend::Assets() {
  std::lock_guard lock(mu_);
  if (assets_) return *assets_;
  BootAssetsOptions o;
  o.kernel = opts_.kernel;
  o.agent_path = opts_.agent_path;
  if (::access((opts_.agent_path + "-guest").c_str(), R_OK) == 0) o.agent_path += "-guest";
  o.cache_dir = opts_.state_dir + "/microvm-assets";
  SBX_ASSIGN_OR_RETURN(BootAssets a, PrepareBootAssets(o));
  assets_ = a;
  return a;
}

absl::StatusOr<std::string> MicrovmBackend::DiskImage(int64_t size_mib, const std::string& dest) {
  SBX_RETURN_IF_ERROR(ns::ValidateDiskMib(static_cast<int>(size_mib)));
  const std::string golden = fmt::format("{}/microvm-assets/golden-{}m.img", opts_.state_dir, size_mib);
  {
    std::lock_guard lock(mu_);
    if (::access(golden.c_str(), R_OK) != 0) {
      SBX_ASSIGN_OR_RETURN(std::string mke2fs, FindProgram("mke2fs"));
      const std::string tmp = golden + ".tmp";
      ::unlink(tmp.c_str());
      SBX_RETURN_IF_ERROR(ns::MakeGoldenImage(mke2fs, tmp, static_cast<int>(size_mib)));
      if (::rename(tmp.c_str(), golden.c_str()) != 0) return ErrnoStatus(errno, "rename golden image");
    }
  }
  SBX_RETURN_IF_ERROR(ns::SparseCopy(golden, dest));
  return dest;
}

absl::StatusOr<InstancePtr> MicrovmBackend::Create(const SandboxSpec& spec) {
  if (!IsValidId(spec.id, "sbx")) {
    return absl::InvalidArgumentError(fmt::format("create sandbox: invalid id \"{}\"", spec.id));
  }
  if (spec.network_ready) {
    return absl::UnimplementedError("microvm: no network-ready warm-pool members (the pool serves the ns runtime)");
  }
  SBX_RETURN_IF_ERROR(CheckCreate(spec.resources, false));
  if (qemu_path_.empty() && firecracker_path_.empty()) SBX_RETURN_IF_ERROR(Probe());
  const bool firecracker = opts_.vmm == "firecracker";
  SBX_ASSIGN_OR_RETURN(BootAssets assets, Assets());
  const std::string dir = SandboxDir(spec.id);
  if (dir.size() + 20 >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(fmt::format(
        "create sandbox {}: {} is too long for unix socket paths (a shorter state.dir)", spec.id, dir));
  }
  std::error_code ec;
  fs::create_directories(opts_.state_dir + "/vm", ec);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, fmt::format("create sandbox {}: mkdir({})", spec.id, dir));
  }
  const ResumeContext ctx{opts_.agent_path, opts_.boot_timeout_s, accel_, opts_.network, &uids_, cgroups_.get()};
  std::unique_ptr<net::SandboxNetwork> network;  // until the instance owns it
  VmRecord rec;
  bool claimed = false;
  // Until the instance exists: what a failure leaves is stopped and removed here (the network
  // by its destructor, since it was never released).
  auto fail = [&](absl::Status s) -> absl::Status {
    Stop(rec.bridge, dir);
    Stop(rec.vmm_pid, dir);
    if (network) (void)network->Destroy();
    if (claimed) (void)uids_.Release(rec.uid, dir);
    std::error_code rm;
    fs::remove_all(dir, rm);
    return Annotate(s, fmt::format("create sandbox {} (microvm)", spec.id));
  };

  // The VMM's own uid, and the one directory it may write.
  auto uid = uids_.Claim(dir);
  if (!uid.ok()) return fail(Annotate(uid.status(), "the VMM's uid"));
  rec.uid = *uid;
  claimed = true;
  if (::mkdir((dir + "/vmm").c_str(), 0700) != 0 || ::chown((dir + "/vmm").c_str(), rec.uid, rec.uid) != 0 ||
      ::mkdir((dir + "/jail").c_str(), 0755) != 0) {
    return fail(ErrnoStatus(errno, fmt::format("mkdir {}/vmm, {}/jail", dir, dir)));
  }

  // What the guest's init builds (agent/vm_init.cc).
  QemuVm vm;
  vm.qemu = qemu_path_;
  vm.accel = accel_;
  vm.vcpus = spec.resources.vcpu;
  vm.memory_mib = spec.resources.memory_mib;
  vm.vmlinux = assets.vmlinux;
  vm.initramfs = assets.initramfs;
  vm.serial_socket = dir + "/vmm/serial.sock";
  vm.qmp_socket = dir + "/vmm/qmp.sock";
  vm.console_log = dir + "/vmm/console.log";
  vm.extra_cmdline = extra_cmdline_;
  vm.disks.push_back({dir + "/guest.cfg", agent::kGuestConfigSerial, true});
  vm.disks.push_back({dir + "/vmm/disk.img", agent::kGuestDiskSerial, false});
  Json lowers = Json::array();
  Json binds = Json::array();
  // The template's trees as shared read-only images (made on first use), top first.
  std::vector<std::string> trees = {spec.tmpl.rootfs_dir};
  trees.insert(trees.end(), spec.tmpl.lower_dirs.begin(), spec.tmpl.lower_dirs.end());
  for (size_t i = 0; i < trees.size(); ++i) {
    auto image = TreeImage(trees[i], opts_.state_dir + "/microvm-assets");
    if (!image.ok()) return fail(Annotate(image.status(), "the template's trees as disks"));
    const std::string serial = fmt::format("sbxl{}", i);
    vm.disks.push_back({*image, serial, true});
    lowers.push_back({{"disk", serial}});
  }
  if (firecracker && !spec.tmpl.binds.empty()) {
    return fail(absl::UnimplementedError(
        "Firecracker has no 9p: a template that binds host directories (base's /usr and /etc) cannot "
        "run on it; use an image template, or runtime.microvm.vmm = \"qemu\""));
  }
  auto shares = SharesForBinds(spec.tmpl.binds, opts_.state_dir + "/microvm-assets/views");
  if (!shares.ok()) return fail(shares.status());
  int b = 0;
  for (const auto& share : *shares) {
    const std::string tag = fmt::format("bind{}", b++);
    vm.shares.push_back({tag, share.host_path});
    binds.push_back({{"tag", tag}, {"path", share.sandbox_path}, {"read_only", true}});
  }
  Json net_cfg = nullptr;
  if (!spec.egress.is_null()) {
    auto resolved = net::ResolvedEgress::FromJson(spec.egress);
    if (!resolved.ok()) return fail(Annotate(resolved.status(), "network"));
    if (resolved->networked) {
      if (opts_.network == nullptr) {
        return fail(absl::FailedPreconditionError(fmt::format(
            "network: egress profile '{}' needs networking, which this sbxd has off (egress.enabled)",
            resolved->profile)));
      }
      // Firecracker opens its tap by name, as the VMM's uid; QEMU gets it open from its jail.
      auto attached = opts_.network->AttachTap(spec.id, resolved->policy(), firecracker ? rec.uid : 0);
      if (!attached.ok()) return fail(Annotate(attached.status(), "network"));
      network = std::move(*attached);
      const net::SandboxAddrs& a = network->addrs();
      vm.tap = network->veth();
      vm.mac = fmt::format("02:73:62:{:02x}:{:02x}:{:02x}", (a.slot >> 16) & 0xff, (a.slot >> 8) & 0xff, a.slot & 0xff);
      auto resolv = ns::PlanResolvConf(spec.tmpl, dir);
      net_cfg = {{"ipv4", a.sandbox4.ToString()},
                 {"ipv6", a.sandbox6.ToString()},
                 {"gw4", a.host4.ToString()},
                 {"gw6", a.host6.ToString()},
                 {"resolv_conf", net::SandboxResolvConf(a.host4, a.host6)},
                 {"resolv_path", resolv.ok() ? resolv->sandbox_path : std::string("/etc/resolv.conf")}};
    }
  }
  std::map<std::string, std::string> env;
  for (const auto& kv : spec.tmpl.env) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env[k] = v;
  env.emplace("PATH", kDefaultPath);
  env.emplace("HOME", "/root");
  Json cfg = {{"id", spec.id},
              {"hostname", spec.hostname.empty() ? spec.id.substr(0, 12) : spec.hostname},
              {"workdir", spec.tmpl.workdir},
              {"lowers", lowers},
              {"binds", binds},
              {"env", env},
              {"tmp_mib", spec.resources.tmp_mib},
              {"shm_mib", spec.resources.shm_mib},
              {"buffer_bytes", opts_.agent_buffer_bytes},
              // QEMU gives the agent a virtio-serial port; Firecracker has only vsock.
              {"agent_link", firecracker ? "vsock" : "virtio-serial"}};
  if (!net_cfg.is_null()) cfg["net"] = net_cfg;
  if (spec.keep_writable_layer) cfg["keep_writable_layer"] = true;
  rec.keep_writable_layer = spec.keep_writable_layer;
  rec.disk_mib = spec.resources.disk_mib;
  {
    // A raw disk: the JSON, then zeros to a whole number of 4 KiB blocks.
    std::string text = cfg.dump();
    text.resize((text.size() / 4096 + 1) * 4096, '\0');
    if (absl::Status st = WriteFileContents(dir + "/guest.cfg", text); !st.ok()) return fail(st);
  }
  ::chmod((dir + "/guest.cfg").c_str(), 0644);  // the VMM's uid reads it
  if (auto disk = DiskImage(spec.resources.disk_mib, dir + "/vmm/disk.img"); !disk.ok()) {
    return fail(disk.status());
  }
  if (::chown((dir + "/vmm/disk.img").c_str(), rec.uid, rec.uid) != 0) {
    return fail(ErrnoStatus(errno, "chown disk.img to the VMM's uid"));
  }
  rec.vcpus = spec.resources.vcpu;
  rec.memory_mib = spec.resources.memory_mib;
  auto cgroup = cgroups_->Create(spec.id, VmCgroupLimits(rec.vcpus, rec.memory_mib));
  if (!cgroup.ok()) return fail(Annotate(cgroup.status(), "the VMM's cgroup"));
  std::vector<std::string> procs;
  for (const auto& d : (*cgroup)->dirs()) procs.push_back(d.path + "/cgroup.procs");
  auto argv = firecracker ? FirecrackerLaunch(dir, vm, spec, procs, rec.uid) : QemuLaunch(dir, vm, spec, procs, rec.uid);
  if (!argv.ok()) return fail(argv.status());
  rec.vmm = opts_.vmm;
  rec.vmm_argv = std::move(*argv);
  rec.migratable = vm.shares.empty();
  auto vmm = OpenVmm(rec.vmm, dir);
  if (!vmm.ok()) return fail(vmm.status());
  auto pid = SpawnDetached(rec.vmm_argv, DetachedOptions{.log = VmmLog(dir, rec)});
  if (!pid.ok()) return fail(pid.status());
  rec.vmm_pid = *pid;
  auto bridge = StartBridge(opts_.agent_path, dir, (*vmm)->Link(), rec.uid);
  if (!bridge.ok()) return fail(bridge.status());
  rec.bridge = *bridge;
  if (auto st = WriteRecord(dir, rec); !st.ok()) return fail(st);
  auto made = NewMicrovmInstance(spec.id, dir, rec, ctx, std::move(network));
  if (!made.ok()) return fail(made.status());
  (*cgroup)->Release();  // the instance's now: Destroy removes it by the sandbox's id
  InstancePtr instance = std::move(*made);
  if (auto st = WaitForAgent(*instance, dir, opts_.boot_timeout_s, accel_); !st.ok()) {
    (void)instance->Destroy();
    return Annotate(st, fmt::format("create sandbox {} (microvm)", spec.id));
  }
  return instance;
}

namespace {

// A tree image or view younger than this is left to the sweep after: a create may be about to
// use what it just made.
constexpr int64_t kSharedAssetMinAgeS = 600;

// The jail spec's bound for the files a VMM writes: its disk (disk_mib) and a suspend's state
// (at most the guest's memory and its devices); the console log may not outgrow them.
unsigned long long MaxFileBytes(const SandboxSpec& spec) {
  return static_cast<unsigned long long>(std::max(spec.resources.disk_mib, spec.resources.memory_mib) + 64) << 20;
}

absl::StatusOr<std::vector<std::string>> Jailed(const std::string& agent, const std::string& dir,
                                                const protocol::JailSpec& jail, const std::vector<std::string>& argv) {
  SBX_RETURN_IF_ERROR(WriteFileContents(dir + "/jail.json", jail.ToJson().dump()));
  std::vector<std::string> out = {agent, "--vm-jail", dir + "/jail.json", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> MicrovmBackend::QemuLaunch(const std::string& dir, const QemuVm& vm,
                                                                    const SandboxSpec& spec,
                                                                    const std::vector<std::string>& cgroup_procs,
                                                                    uint32_t uid) {
  // The jail holds QEMU's program and libraries (/usr), what the VM reads, and vmm/.
  protocol::JailSpec jail;
  jail.cgroup_procs = cgroup_procs;
  jail.uid = jail.gid = uid;
  jail.root = dir + "/jail";
  jail.tap = vm.tap;
  jail.max_file_bytes = MaxFileBytes(spec);
  jail.binds.push_back({"/usr", false, false});
  // A QEMU installed elsewhere (runtime.microvm.qemu) comes along as its one file; its
  // libraries are the host's (/usr) or a failing exec says which is missing in qemu.log.
  if (!qemu_path_.starts_with("/usr/")) jail.binds.push_back({qemu_path_, false, false});
  jail.binds.push_back({"/dev/null", true, true});
  jail.binds.push_back({"/dev/urandom", false, true});
  if (accel_ == "kvm") {
    jail.binds.push_back({"/dev/kvm", true, true});
    struct stat kvm;
    if (::stat("/dev/kvm", &kvm) == 0 && kvm.st_gid != 0) jail.groups.push_back(kvm.st_gid);
  }
  for (const std::string& p : {vm.vmlinux, vm.initramfs}) jail.binds.push_back({p, false, false});
  for (const auto& d : vm.disks) {
    if (d.read_only) jail.binds.push_back({d.path, false, false});
  }
  for (const auto& sh : vm.shares) jail.binds.push_back({sh.host_path, false, false});
  jail.binds.push_back({dir + "/vmm", true, false});
  return Jailed(opts_.agent_path, dir, jail, QemuArgv(vm));
}

// Firecracker's jailer makes the chroot, the device nodes, the uid and the new PID namespace;
// the jail before it only joins the VMM's cgroup and bounds its files (delegate mode).
absl::StatusOr<std::vector<std::string>> MicrovmBackend::FirecrackerLaunch(
    const std::string& dir, const QemuVm& vm, const SandboxSpec& spec, const std::vector<std::string>& cgroup_procs,
    uint32_t uid) {
  FirecrackerVm fc;
  fc.firecracker = firecracker_path_;
  fc.jailer = jailer_path_;
  fc.vm_dir = dir;
  fc.sandbox_id = spec.id;
  fc.uid = uid;
  fc.vcpus = vm.vcpus;
  fc.memory_mib = vm.memory_mib;
  fc.vmlinux = vm.vmlinux;
  fc.initramfs = vm.initramfs;
  fc.tap = vm.tap;
  fc.mac = vm.mac;
  fc.max_file_bytes = MaxFileBytes(spec);
  // In the order the guest knows them by (sbx.disks=order): config, disk, trees.
  for (const auto& d : vm.disks) fc.drives.push_back({d.path, d.read_only});
  SBX_ASSIGN_OR_RETURN(std::vector<std::string> argv, PrepareFirecracker(fc));
  protocol::JailSpec jail;
  jail.cgroup_procs = cgroup_procs;
  jail.delegate = true;
  jail.max_file_bytes = MaxFileBytes(spec);
  return Jailed(opts_.agent_path, dir, jail, argv);
}

absl::StatusOr<InstancePtr> MicrovmBackend::Adopt(const std::string& id, const Json& persisted) {
  if (!IsValidId(id, "sbx")) {
    return absl::InvalidArgumentError(fmt::format("adopt sandbox: invalid id \"{}\"", id));
  }
  // vm.json in the sandbox's dir is the VM's record, kept with the VM itself; the store's
  // record says what network policy it has.
  const std::string dir = SandboxDir(id);
  auto rec = ReadRecord(dir);
  if (!rec.ok()) return absl::NotFoundError(fmt::format("adopt sandbox {}: {}", id, std::string(rec.status().message())));
  const ResumeContext ctx{opts_.agent_path, opts_.boot_timeout_s, accel_, opts_.network, &uids_, cgroups_.get()};
  if (rec->uid != 0) SBX_RETURN_IF_ERROR(Annotate(uids_.Reclaim(rec->uid, dir), fmt::format("adopt sandbox {}", id)));
  std::unique_ptr<net::SandboxNetwork> network;
  if (persisted.is_object() && persisted.value("networked", false)) {
    network = ns::AdoptNetwork(opts_.network, id, persisted.value("egress", Json(nullptr)));
    if (!network) return absl::NotFoundError(fmt::format("adopt sandbox {}: its tap is gone", id));
  }
  if (rec->suspended) {
    // sbxd died while suspending or waking: the state file holds the VM; processes the record
    // still names are leftovers of that step.
    if (::access((dir + "/state").c_str(), R_OK) != 0) {
      return absl::NotFoundError(fmt::format("adopt sandbox {}: suspended, but {}/state is gone", id, dir));
    }
    Stop(rec->bridge, dir);
    Stop(rec->vmm_pid, dir);
    rec->vmm_pid = rec->bridge = 0;
    SBX_RETURN_IF_ERROR(WriteRecord(dir, *rec));
    return NewMicrovmInstance(id, dir, *rec, ctx, std::move(network));
  }
  if (!IsOurs(rec->vmm_pid, dir)) {
    return absl::NotFoundError(fmt::format("adopt sandbox {}: its VMM (pid {}) is gone", id, rec->vmm_pid));
  }
  if (!IsOurs(rec->bridge, dir)) {
    // The VM outlived its bridge: a new one says hello, and the guest drops the old streams.
    SBX_ASSIGN_OR_RETURN(std::unique_ptr<Vmm> vmm, OpenVmm(rec->vmm, dir));
    auto b = StartBridge(opts_.agent_path, dir, vmm->Link(), rec->uid);
    if (!b.ok()) return Annotate(b.status(), fmt::format("adopt sandbox {}: restart its bridge", id));
    rec->bridge = *b;
    SBX_RETURN_IF_ERROR(WriteRecord(dir, *rec));
  }
  return NewMicrovmInstance(id, dir, *rec, ctx, std::move(network));
}

absl::Status MicrovmBackend::Remove(const std::string& id) {
  if (!IsValidId(id, "sbx")) return absl::InvalidArgumentError(fmt::format("remove: invalid id \"{}\"", id));
  const std::string dir = SandboxDir(id);
  if (auto rec = ReadRecord(dir); rec.ok()) {
    Stop(rec->bridge, dir);
    Stop(rec->vmm_pid, dir);
  }
  if (cgroups_) (void)cgroups_->Existing(id)->Destroy();
  (void)uids_.ReleaseOwner(dir);
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return absl::InternalError(fmt::format("remove {}: {}", dir, ec.message()));
  return absl::OkStatus();
}

absl::Status MicrovmBackend::Sweep(const std::set<std::string>& known_ids) {
  const std::string root = opts_.state_dir + "/vm";
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, fmt::format("opendir({})", root));
  std::vector<std::string> gone;
  while (dirent* e = ::readdir(d)) {
    const std::string id = e->d_name;
    if (id == "." || id == "..") continue;
    if (known_ids.count(id) == 0) gone.push_back(id);
  }
  ::closedir(d);
  absl::Status first;
  for (const auto& id : gone) {
    absl::Status st;
    if (IsValidId(id, "sbx")) {
      st = Remove(id);
    } else {
      std::error_code ec;
      fs::remove_all(root + "/" + id, ec);
    }
    if (!st.ok() && first.ok()) first = st;
  }
  if (auto st = uids_.Sweep(root, known_ids); !st.ok() && first.ok()) first = st;
  // Half-made boot assets of a process that died while making them.
  if (DIR* a = ::opendir((opts_.state_dir + "/microvm-assets").c_str())) {
    while (dirent* e = ::readdir(a)) {
      if (std::string(e->d_name).rfind(".tmp-", 0) == 0) {
        std::error_code ec;
        fs::remove_all(opts_.state_dir + "/microvm-assets/" + e->d_name, ec);
      }
    }
    ::closedir(a);
  }
  // Tree images and masked views no VM uses any more: they grow with every template and host
  // tree a host has run, and a deleted template's image would otherwise stay for good.
  for (const auto& path : SweepSharedAssets(opts_.state_dir + "/microvm-assets", root, kSharedAssetMinAgeS)) {
    spdlog::info("microvm: removed {} (no VM uses it)", path);
  }
  return first;
}

}  // namespace sbx::runtime::microvm
