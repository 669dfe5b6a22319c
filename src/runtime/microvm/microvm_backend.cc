#include "runtime/microvm/microvm_backend.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/files.h"
#include "common/ids.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"
#include "runtime/microvm/host_view.h"
#include "runtime/microvm/qemu.h"
#include "runtime/ns/disk_image.h"

namespace sbx::runtime::microvm {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr char kDefaultPath[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

std::string Tail(const std::string& s, size_t n) {
  std::string t = s.size() > n ? s.substr(s.size() - n) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t;
}

// The last `n` bytes of a log file, read from its end. console.log holds whatever the guest
// wrote to its serial console, any amount: only the tail ever enters sbxd's memory.
std::string FileTail(const std::string& path, size_t n) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return {};
  const off_t size = st.st_size;
  const off_t from = size > static_cast<off_t>(n) ? size - static_cast<off_t>(n) : 0;
  std::string out(static_cast<size_t>(size - from), '\0');
  const ssize_t r = ::pread(fd.get(), out.data(), out.size(), from);
  out.resize(r > 0 ? static_cast<size_t>(r) : 0);
  return Tail(out, n);
}

// The process `pid` is alive (not a zombie) and its command line names `dir`: guards every
// kill of a pid read from a file against pid reuse.
bool IsOurs(pid_t pid, const std::string& dir) {
  if (pid <= 0) return false;
  const std::string stat = ReadFileOrEmpty(fmt::format("/proc/{}/stat", pid));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  if (state == 'Z' || state == 'X') return false;
  const std::string cmdline = ReadFileOrEmpty(fmt::format("/proc/{}/cmdline", pid));
  return cmdline.find(dir + "/") != std::string::npos;
}

// Starts argv[0] in a session of its own (outside sbxd's, so it outlives a kill -9 of sbxd),
// stdin /dev/null, stdout and stderr to `log`, default signal dispositions.
absl::StatusOr<pid_t> SpawnDetached(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  char* envp[] = {const_cast<char*>("PATH=/usr/sbin:/usr/bin:/sbin:/bin"), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &fa, &attr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoStatus(rc, fmt::format("posix_spawn({})", args[0]));
  return pid;
}

// Kills `pid` (and its process group: it leads its session) if it is still ours, and waits
// until it is gone: reaped when it is our child, vanished from /proc otherwise.
void Stop(pid_t pid, const std::string& dir) {
  if (pid <= 0) return;
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) return;  // it had ended on its own; now reaped
  const bool child = r == 0;
  if (!child && !IsOurs(pid, dir)) return;
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  if (child) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (IsOurs(pid, dir) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
}

// How a child we reaped ended, for error messages; the reap happens once, so the status is kept.
std::string Ended(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return "ended";
}

// Our own unreaped child cannot have been replaced by another process, and its command line
// may still be empty while its exec finishes (posix_spawn returns once the child's memory is
// replaced, before its arguments are in place): only a process we did not start (adopted after
// a restart) is checked by its command line.
bool Alive(pid_t pid, const std::string& dir, std::string* ended = nullptr) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) {
    if (ended != nullptr) *ended = Ended(status);
    return false;
  }
  if (r == 0) return true;
  return IsOurs(pid, dir);
}

absl::StatusOr<std::pair<pid_t, pid_t>> ReadPids(const std::string& dir) {
  std::string text = ReadFileOrEmpty(dir + "/vm.json");
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("qemu_pid") || !j["qemu_pid"].is_number_integer() ||
      !j.contains("bridge_pid") || !j["bridge_pid"].is_number_integer()) {
    return absl::NotFoundError(fmt::format("{}/vm.json: no pids", dir));
  }
  return std::make_pair(j["qemu_pid"].get<pid_t>(), j["bridge_pid"].get<pid_t>());
}

absl::Status WritePids(const std::string& dir, pid_t qemu, pid_t bridge) {
  const std::string tmp = dir + "/vm.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << Json{{"qemu_pid", qemu}, {"bridge_pid", bridge}}.dump() << "\n";
    if (!out) return absl::InternalError(fmt::format("write {}", tmp));
  }
  if (::rename(tmp.c_str(), (dir + "/vm.json").c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("rename({}, vm.json)", tmp));
  }
  return absl::OkStatus();
}

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

absl::StatusOr<std::string> FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return ErrnoStatus(errno, fmt::format("access({})", name));
  }
  std::vector<std::string> dirs = {"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"};
  if (const char* p = std::getenv("PATH"); p != nullptr) {
    std::string path = p;
    size_t start = 0;
    while (start <= path.size()) {
      size_t end = path.find(':', start);
      if (end == std::string::npos) end = path.size();
      if (end > start) dirs.push_back(path.substr(start, end - start));
      start = end + 1;
    }
  }
  for (const auto& d : dirs) {
    const std::string c = d + "/" + name;
    if (d.starts_with("/") && ::access(c.c_str(), X_OK) == 0) return c;
  }
  return absl::NotFoundError(fmt::format("{} is not installed", name));
}

class MicrovmInstance : public Instance {
 public:
  MicrovmInstance(std::string id, std::string dir, pid_t qemu, pid_t bridge)
      : id_(std::move(id)), dir_(std::move(dir)), qemu_(qemu), bridge_(bridge) {}

  const std::string& id() const override { return id_; }
  std::string AgentSocketPath() const override { return dir_ + "/agent.sock"; }
  Json Persist() const override {
    return Json{{"dir", dir_}, {"qemu_pid", qemu_}, {"bridge_pid", bridge_}};
  }
  bool Alive() const override {
    const bool qemu = microvm::Alive(qemu_, dir_, &qemu_ended_);
    const bool bridge = microvm::Alive(bridge_, dir_, &bridge_ended_);
    return qemu && bridge;
  }
  std::string DeathReason() const override {
    // The bridge ends when QEMU's end of the port closes, often before QEMU has exited and
    // its console file holds the guest's last words: give QEMU a moment to finish.
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (microvm::Alive(qemu_, dir_, &qemu_ended_) && !microvm::Alive(bridge_, dir_, &bridge_ended_) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    const std::string console = FileTail(dir_ + "/console.log", 2000);
    if (const size_t p = console.find("Kernel panic"); p != std::string::npos) {
      return "the guest kernel panicked: " + Tail(console.substr(p, console.find('\n', p) - p), 300);
    }
    if (const size_t p = console.find("sbx-init: "); p != std::string::npos) {
      return "the guest's init failed: " + Tail(console.substr(p, console.find('\n', p) - p), 300);
    }
    const std::string qemu = FileTail(dir_ + "/qemu.log", 300);
    if (!microvm::Alive(qemu_, dir_, &qemu_ended_) || !qemu.empty()) {
      return fmt::format("the VMM (QEMU) exited ({}){}{}", qemu_ended_.empty() ? "not our child" : qemu_ended_,
                         qemu.empty() ? "" : ": " + qemu,
                         console.empty() ? "" : "; guest console: " + Tail(console, 300));
    }
    const std::string bridge = FileTail(dir_ + "/bridge.log", 300);
    return fmt::format("the VM's agent bridge exited ({}){}", bridge_ended_.empty() ? "not our child" : bridge_ended_,
                       bridge.empty() ? std::string() : ": " + bridge);
  }
  absl::Status Destroy() override {
    Stop(bridge_, dir_);
    Stop(qemu_, dir_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (ec) return absl::InternalError(fmt::format("destroy {}: remove {}: {}", id_, dir_, ec.message()));
    return absl::OkStatus();
  }
  // The VMM stops the vCPUs: nothing in the guest runs, its memory stays resident.
  absl::Status Freeze() override {
    return Annotate(QmpCommand(dir_ + "/qmp.sock", "stop").status(), fmt::format("pause {}", id_));
  }
  absl::Status Thaw() override {
    return Annotate(QmpCommand(dir_ + "/qmp.sock", "cont").status(), fmt::format("wake {}", id_));
  }
  absl::StatusOr<bool> IsFrozen() const override {
    auto st = QmpCommand(dir_ + "/qmp.sock", "query-status");
    if (!st.ok()) return st.status();
    return st->value("status", std::string()) != "running";
  }

 private:
  std::string id_;
  std::string dir_;
  pid_t qemu_;
  pid_t bridge_;
  mutable std::string qemu_ended_, bridge_ended_;  // how each ended, once reaped here
};

}  // namespace

MicrovmBackend::MicrovmBackend(MicrovmOptions opts) : opts_(std::move(opts)) {}

std::string MicrovmBackend::SandboxDir(const std::string& id) const {
  return fmt::format("{}/vm/{}", opts_.state_dir, id);
}

absl::Status MicrovmBackend::Probe() {
  auto qemu = FindProgram(opts_.qemu);
  if (!qemu.ok()) {
    return Annotate(qemu.status(),
                    "microvm: no QEMU (apt-get install qemu-system-x86, or set runtime.microvm.qemu)");
  }
  qemu_path_ = *qemu;
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
  return absl::OkStatus();
}

absl::Status MicrovmBackend::CheckCreate(const Resources& effective, bool networked) const {
  if (networked) {
    return absl::UnimplementedError(
        "microvm: networked sandboxes are not built yet (egress profile none only)");
  }
  if (effective.memory_mib < kMinGuestMemoryMib) {
    return absl::InvalidArgumentError(fmt::format(
        "resources.memory_mib: a microVM needs at least {} MiB (its kernel and initramfs), got {}",
        kMinGuestMemoryMib, effective.memory_mib));
  }
  return ns::ValidateDiskMib(static_cast<int>(effective.disk_mib));
}

Json MicrovmBackend::Describe() const {
  return Json{{"vmm", "qemu"}, {"accel", accel_}, {"accel_reason", accel_reason_},
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
  SBX_RETURN_IF_ERROR(CheckCreate(spec.resources, !spec.egress.is_null() || spec.network_ready));
  if (spec.keep_writable_layer) {
    return absl::UnimplementedError("microvm: template builds run on the ns runtime");
  }
  if (qemu_path_.empty()) SBX_RETURN_IF_ERROR(Probe());
  SBX_ASSIGN_OR_RETURN(BootAssets assets, Assets());
  const std::string dir = SandboxDir(spec.id);
  if (dir.size() + 16 >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(fmt::format(
        "create sandbox {}: {} is too long for unix socket paths (a shorter state.dir)", spec.id, dir));
  }
  std::error_code ec;
  fs::create_directories(opts_.state_dir + "/vm", ec);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, fmt::format("create sandbox {}: mkdir({})", spec.id, dir));
  }
  auto instance = std::make_unique<MicrovmInstance>(spec.id, dir, 0, 0);
  auto fail = [&](absl::Status s) -> absl::Status {
    (void)instance->Destroy();
    return Annotate(s, fmt::format("create sandbox {} (microvm)", spec.id));
  };
  if (::mkdir((dir + "/guest").c_str(), 0755) != 0) {
    return fail(ErrnoStatus(errno, fmt::format("mkdir({}/guest)", dir)));
  }

  // What the guest's init builds (agent/vm_init.cc).
  QemuVm vm;
  vm.qemu = qemu_path_;
  vm.accel = accel_;
  vm.vcpus = spec.resources.vcpu;
  vm.memory_mib = spec.resources.memory_mib;
  vm.vmlinux = assets.vmlinux;
  vm.initramfs = assets.initramfs;
  vm.disk_image = dir + "/disk.img";
  vm.serial_socket = dir + "/serial.sock";
  vm.qmp_socket = dir + "/qmp.sock";
  vm.console_log = dir + "/console.log";
  vm.extra_cmdline = extra_cmdline_;
  vm.shares.push_back({"sbxcfg", dir + "/guest"});
  Json lowers = Json::array();
  Json binds = Json::array();
  int n = 0;
  auto lower = [&](const std::string& path) {
    const std::string tag = fmt::format("lower{}", n++);
    vm.shares.push_back({tag, path});
    lowers.push_back(tag);
  };
  lower(spec.tmpl.rootfs_dir);
  for (const auto& l : spec.tmpl.lower_dirs) lower(l);
  auto shares = SharesForBinds(spec.tmpl.binds, opts_.state_dir + "/microvm-assets/views");
  if (!shares.ok()) return fail(shares.status());
  int b = 0;
  for (const auto& share : *shares) {
    const std::string tag = fmt::format("bind{}", b++);
    vm.shares.push_back({tag, share.host_path});
    binds.push_back({{"tag", tag}, {"path", share.sandbox_path}, {"read_only", true}});
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
              {"buffer_bytes", opts_.agent_buffer_bytes}};
  {
    std::ofstream out(dir + "/guest/config.json");
    out << cfg.dump();
    if (!out) return fail(absl::InternalError(fmt::format("write {}/guest/config.json", dir)));
  }
  if (auto disk = DiskImage(spec.resources.disk_mib, vm.disk_image); !disk.ok()) {
    return fail(disk.status());
  }

  auto qemu = SpawnDetached(QemuArgv(vm), dir + "/qemu.log");
  if (!qemu.ok()) return fail(qemu.status());
  instance = std::make_unique<MicrovmInstance>(spec.id, dir, *qemu, 0);
  auto bridge = SpawnDetached({opts_.agent_path, "--vm-bridge", vm.serial_socket, dir + "/agent.sock"},
                              dir + "/bridge.log");
  if (!bridge.ok()) return fail(bridge.status());
  instance = std::make_unique<MicrovmInstance>(spec.id, dir, *qemu, *bridge);
  if (auto st = WritePids(dir, *qemu, *bridge); !st.ok()) return fail(st);

  // Ready when the agent answers through the bridge; a VM that exits first says why.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opts_.boot_timeout_s);
  auto backoff = 5ms;
  for (;;) {
    auto ping = protocol::CallAgent(dir + "/agent.sock", protocol::Json{{"op", "ping"}}, 2000);
    if (ping.ok()) break;
    if (!instance->Alive()) return fail(absl::UnavailableError(instance->DeathReason()));
    if (std::chrono::steady_clock::now() >= deadline) {
      return fail(absl::DeadlineExceededError(fmt::format(
          "the guest's agent did not answer within {} s (accel {}): {}; guest console: {}",
          opts_.boot_timeout_s, accel_, std::string(ping.status().message()),
          FileTail(dir + "/console.log", 400))));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, 50ms);
  }
  return InstancePtr(std::move(instance));
}

absl::StatusOr<InstancePtr> MicrovmBackend::Adopt(const std::string& id, const Json& persisted) {
  if (!IsValidId(id, "sbx")) {
    return absl::InvalidArgumentError(fmt::format("adopt sandbox: invalid id \"{}\"", id));
  }
  (void)persisted;  // vm.json in the sandbox's dir is the record, kept with the VM itself
  const std::string dir = SandboxDir(id);
  auto pids = ReadPids(dir);
  if (!pids.ok()) return absl::NotFoundError(fmt::format("adopt sandbox {}: {}", id, std::string(pids.status().message())));
  auto [qemu, bridge] = *pids;
  if (!IsOurs(qemu, dir)) {
    return absl::NotFoundError(fmt::format("adopt sandbox {}: its VMM (pid {}) is gone", id, qemu));
  }
  if (!IsOurs(bridge, dir)) {
    // The VM outlived its bridge: a new one says hello, and the guest drops the old streams.
    auto b = SpawnDetached({opts_.agent_path, "--vm-bridge", dir + "/serial.sock", dir + "/agent.sock"},
                           dir + "/bridge.log");
    if (!b.ok()) return Annotate(b.status(), fmt::format("adopt sandbox {}: restart its bridge", id));
    bridge = *b;
    SBX_RETURN_IF_ERROR(WritePids(dir, qemu, bridge));
  }
  return InstancePtr(std::make_unique<MicrovmInstance>(id, dir, qemu, bridge));
}

absl::Status MicrovmBackend::Remove(const std::string& id) {
  if (!IsValidId(id, "sbx")) return absl::InvalidArgumentError(fmt::format("remove: invalid id \"{}\"", id));
  const std::string dir = SandboxDir(id);
  if (auto pids = ReadPids(dir); pids.ok()) {
    Stop(pids->second, dir);
    Stop(pids->first, dir);
  }
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
  return first;
}

}  // namespace sbx::runtime::microvm
