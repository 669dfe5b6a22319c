#include "runtime/microvm/microvm_backend.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <signal.h>
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
#include "common/process.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"
#include "agent/vm_init.h"
#include "runtime/microvm/host_view.h"
#include "runtime/microvm/qemu.h"
#include "runtime/microvm/tree_image.h"
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

// vm.json, the VM's record beside it: what adoption, delete and the sweep need after sbxd
// restarts, and what a wake from suspend needs to start QEMU again with the same devices.
struct VmRecord {
  pid_t qemu = 0;
  pid_t bridge = 0;
  bool suspended = false;   // the state is in <dir>/state, no process runs
  bool migratable = false;  // no 9p share: suspend can save the VM
  std::vector<std::string> qemu_argv;
};

absl::StatusOr<VmRecord> ReadRecord(const std::string& dir) {
  std::string text = ReadFileOrEmpty(dir + "/vm.json");
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("qemu_pid") || !j["qemu_pid"].is_number_integer() ||
      !j.contains("bridge_pid") || !j["bridge_pid"].is_number_integer()) {
    return absl::NotFoundError(fmt::format("{}/vm.json: no pids", dir));
  }
  VmRecord r;
  r.qemu = j["qemu_pid"].get<pid_t>();
  r.bridge = j["bridge_pid"].get<pid_t>();
  r.suspended = j.value("suspended", false);
  r.migratable = j.value("migratable", false);
  if (j.contains("qemu_argv") && j["qemu_argv"].is_array()) {
    for (const auto& a : j["qemu_argv"]) {
      if (a.is_string()) r.qemu_argv.push_back(a.get<std::string>());
    }
  }
  return r;
}

absl::Status WriteRecord(const std::string& dir, const VmRecord& r) {
  const std::string tmp = dir + "/vm.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << Json{{"qemu_pid", r.qemu}, {"bridge_pid", r.bridge}, {"suspended", r.suspended},
                {"migratable", r.migratable}, {"qemu_argv", r.qemu_argv}}
               .dump()
        << "\n";
    if (!out) return absl::InternalError(fmt::format("write {}", tmp));
  }
  if (::rename(tmp.c_str(), (dir + "/vm.json").c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("rename({}, vm.json)", tmp));
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> StartBridge(const std::string& agent, const std::string& dir) {
  return SpawnDetached({agent, "--vm-bridge", dir + "/serial.sock", dir + "/agent.sock"},
                       DetachedOptions{.log = dir + "/bridge.log"});
}

// Until the guest's agent answers through the bridge; a VM that exits first says why.
absl::Status WaitForAgent(const Instance& vm, const std::string& dir, int timeout_s, const std::string& accel) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  auto backoff = 5ms;
  for (;;) {
    auto ping = protocol::CallAgent(dir + "/agent.sock", protocol::Json{{"op", "ping"}}, 2000);
    if (ping.ok()) return absl::OkStatus();
    if (!vm.Alive()) return absl::UnavailableError(vm.DeathReason());
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "the guest's agent did not answer within {} s (accel {}): {}; guest console: {}", timeout_s, accel,
          std::string(ping.status().message()), FileTail(dir + "/console.log", 400)));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, 50ms);
  }
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

// What a resumed VM needs from its backend.
struct ResumeContext {
  std::string agent_path;
  int boot_timeout_s = 60;
  std::string accel;
};

class MicrovmInstance : public Instance {
 public:
  MicrovmInstance(std::string id, std::string dir, VmRecord rec, ResumeContext ctx)
      : id_(std::move(id)), dir_(std::move(dir)), rec_(std::move(rec)), ctx_(std::move(ctx)) {}

  const std::string& id() const override { return id_; }
  std::string AgentSocketPath() const override { return dir_ + "/agent.sock"; }
  Json Persist() const override {
    return Json{{"dir", dir_}, {"qemu_pid", rec_.qemu}, {"bridge_pid", rec_.bridge}, {"suspended", rec_.suspended}};
  }
  bool Alive() const override {
    if (rec_.suspended) return true;  // nothing runs, and nothing is lost: the state is on disk
    const bool qemu = microvm::Alive(rec_.qemu, dir_, &qemu_ended_);
    const bool bridge = microvm::Alive(rec_.bridge, dir_, &bridge_ended_);
    return qemu && bridge;
  }
  std::string DeathReason() const override {
    // The bridge ends when QEMU's end of the port closes, often before QEMU has exited and
    // its console file holds the guest's last words: give QEMU a moment to finish.
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (microvm::Alive(rec_.qemu, dir_, &qemu_ended_) && !microvm::Alive(rec_.bridge, dir_, &bridge_ended_) &&
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
    if (!microvm::Alive(rec_.qemu, dir_, &qemu_ended_) || !qemu.empty()) {
      return fmt::format("the VMM (QEMU) exited ({}){}{}", qemu_ended_.empty() ? "not our child" : qemu_ended_,
                         qemu.empty() ? "" : ": " + qemu,
                         console.empty() ? "" : "; guest console: " + Tail(console, 300));
    }
    const std::string bridge = FileTail(dir_ + "/bridge.log", 300);
    return fmt::format("the VM's agent bridge exited ({}){}", bridge_ended_.empty() ? "not our child" : bridge_ended_,
                       bridge.empty() ? std::string() : ": " + bridge);
  }
  absl::Status Destroy() override {
    Stop(rec_.bridge, dir_);
    Stop(rec_.qemu, dir_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (ec) return absl::InternalError(fmt::format("destroy {}: remove {}: {}", id_, dir_, ec.message()));
    return absl::OkStatus();
  }
  // The VMM stops the vCPUs: nothing in the guest runs, its memory stays resident.
  absl::Status Freeze() override {
    if (rec_.suspended) return absl::OkStatus();
    return Annotate(QmpCommand(dir_ + "/qmp.sock", "stop").status(), fmt::format("pause {}", id_));
  }
  absl::Status Thaw() override { return Resume(); }
  absl::StatusOr<bool> IsFrozen() const override {
    if (rec_.suspended) return true;
    auto st = QmpCommand(dir_ + "/qmp.sock", "query-status");
    if (!st.ok()) return st.status();
    return st->value("status", std::string()) != "running";
  }

  // The VM's whole state (memory, vCPUs, devices) goes to <dir>/state as a QEMU migration
  // stream, then QEMU and the bridge exit: the host has the guest's memory back. A VM with a
  // 9p share mounted cannot be migrated (QEMU refuses), so it is paused instead.
  absl::StatusOr<SuspendOutcome> Suspend() override {
    if (rec_.suspended) {
      return SuspendOutcome{.memory_released = true, .how = "already saved to disk", .snapshot_bytes = StateBytes()};
    }
    SBX_RETURN_IF_ERROR(Freeze());
    if (!rec_.migratable) {
      return SuspendOutcome{.how = "paused with its memory resident: the template shares host directories "
                                   "with the VM (9p), and QEMU cannot save a VM that has them mounted"};
    }
    const std::string state = dir_ + "/state", tmp = dir_ + "/state.tmp";
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoStatus(errno, fmt::format("suspend {}: open({})", id_, tmp));
    auto saved = QmpSaveState(dir_ + "/qmp.sock", fd.get(), 300s);
    if (!saved.ok()) {
      ::unlink(tmp.c_str());
      return Annotate(saved.status(), fmt::format("suspend {}: save the VM (it stays paused)", id_));
    }
    if (::fsync(fd.get()) != 0 || ::rename(tmp.c_str(), state.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return ErrnoStatus(e, fmt::format("suspend {}: keep {} (the VM stays paused)", id_, state));
    }
    fd.Reset();
    // The record says "suspended" before any process ends: a crash from here on wakes from
    // the file, which holds everything (adoption stops the processes the record still names).
    VmRecord next = rec_;
    next.suspended = true;
    if (auto st = WriteRecord(dir_, next); !st.ok()) {
      ::unlink(state.c_str());
      return Annotate(st, fmt::format("suspend {} (the VM stays paused)", id_));
    }
    (void)QmpCommand(dir_ + "/qmp.sock", "quit");
    Stop(rec_.qemu, dir_);
    Stop(rec_.bridge, dir_);
    next.qemu = next.bridge = 0;
    (void)WriteRecord(dir_, next);
    rec_ = next;
    qemu_ended_.clear();
    bridge_ended_.clear();
    return SuspendOutcome{.memory_released = true,
                          .how = "saved to the host's disk with the VM's devices; QEMU exited, so the host "
                                 "has the guest's memory back",
                          .snapshot_bytes = StateBytes()};
  }

  // From a pause: the vCPUs continue. From a suspend: a new QEMU with the same devices loads
  // the saved state, a new bridge says hello (the guest drops the streams of the old one), and
  // the state file goes once the agent answers.
  absl::Status Resume() override {
    if (!rec_.suspended) {
      return Annotate(QmpCommand(dir_ + "/qmp.sock", "cont").status(), fmt::format("wake {}", id_));
    }
    if (rec_.qemu_argv.empty()) {
      return absl::FailedPreconditionError(fmt::format("wake {}: vm.json has no QEMU command line", id_));
    }
    const std::string state = dir_ + "/state";
    UniqueFd in(::open(state.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in.valid()) return ErrnoStatus(errno, fmt::format("wake {}: open({})", id_, state));
    std::vector<std::string> argv = rec_.qemu_argv;
    argv.push_back("-incoming");
    argv.push_back("fd:3");
    auto qemu = SpawnDetached(argv, DetachedOptions{.log = dir_ + "/qemu.log", .pass_fd = in.get()});
    if (!qemu.ok()) return Annotate(qemu.status(), fmt::format("wake {}", id_));
    in.Reset();
    const VmRecord before = rec_;
    VmRecord live = rec_;
    live.qemu = *qemu;
    auto undo = [&](absl::Status st) {
      Stop(live.bridge, dir_);
      Stop(live.qemu, dir_);
      rec_ = before;
      (void)WriteRecord(dir_, before);
      return Annotate(st, fmt::format("wake {} (it stays suspended)", id_));
    };
    // Still suspended (the file is the truth until the agent answers), but a crash from here
    // leaves processes that adoption must stop: the record names them.
    if (auto st = WriteRecord(dir_, live); !st.ok()) return undo(st);
    // QEMU answers QMP once it listens; the load runs before the VM may continue.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(ctx_.boot_timeout_s);
    for (auto pause = 2ms;; pause = std::min<std::chrono::milliseconds>(pause * 2, 20ms)) {
      auto st = QmpCommand(dir_ + "/qmp.sock", "query-status");
      if (st.ok() && st->value("status", std::string()) != "inmigrate") break;
      std::string ended;
      if (!microvm::Alive(live.qemu, dir_, &ended)) {
        return undo(absl::UnavailableError(fmt::format("QEMU exited ({}) loading {}: {}", ended, state,
                                                       FileTail(dir_ + "/qemu.log", 300))));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return undo(absl::DeadlineExceededError(fmt::format("QEMU did not load {} within {} s", state, ctx_.boot_timeout_s)));
      }
      std::this_thread::sleep_for(pause);
    }
    auto bridge = StartBridge(ctx_.agent_path, dir_);
    if (!bridge.ok()) return undo(bridge.status());
    live.bridge = *bridge;
    if (auto st = WriteRecord(dir_, live); !st.ok()) return undo(st);
    if (auto st = QmpCommand(dir_ + "/qmp.sock", "cont"); !st.ok()) return undo(st.status());
    live.suspended = false;
    rec_ = live;
    if (auto st = WaitForAgent(*this, dir_, ctx_.boot_timeout_s, ctx_.accel); !st.ok()) return undo(st);
    if (auto st = WriteRecord(dir_, rec_); !st.ok()) return undo(st);
    ::unlink(state.c_str());
    return absl::OkStatus();
  }

 private:
  int64_t StateBytes() const {
    struct stat st;
    return ::stat((dir_ + "/state").c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
  }

  std::string id_;
  std::string dir_;
  VmRecord rec_;
  ResumeContext ctx_;
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
  const ResumeContext ctx{opts_.agent_path, opts_.boot_timeout_s, accel_};
  auto instance = std::make_unique<MicrovmInstance>(spec.id, dir, VmRecord{}, ctx);
  auto fail = [&](absl::Status s) -> absl::Status {
    (void)instance->Destroy();
    return Annotate(s, fmt::format("create sandbox {} (microvm)", spec.id));
  };

  // What the guest's init builds (agent/vm_init.cc).
  QemuVm vm;
  vm.qemu = qemu_path_;
  vm.accel = accel_;
  vm.vcpus = spec.resources.vcpu;
  vm.memory_mib = spec.resources.memory_mib;
  vm.vmlinux = assets.vmlinux;
  vm.initramfs = assets.initramfs;
  vm.serial_socket = dir + "/serial.sock";
  vm.qmp_socket = dir + "/qmp.sock";
  vm.console_log = dir + "/console.log";
  vm.extra_cmdline = extra_cmdline_;
  vm.disks.push_back({dir + "/guest.cfg", agent::kGuestConfigSerial, true});
  vm.disks.push_back({dir + "/disk.img", agent::kGuestDiskSerial, false});
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
    // A raw disk: the JSON, then zeros to a whole number of 4 KiB blocks.
    std::string text = cfg.dump();
    text.resize((text.size() / 4096 + 1) * 4096, '\0');
    std::ofstream out(dir + "/guest.cfg", std::ios::binary);
    out << text;
    if (!out) return fail(absl::InternalError(fmt::format("write {}/guest.cfg", dir)));
  }
  if (auto disk = DiskImage(spec.resources.disk_mib, dir + "/disk.img"); !disk.ok()) {
    return fail(disk.status());
  }

  VmRecord rec;
  rec.qemu_argv = QemuArgv(vm);
  rec.migratable = vm.shares.empty();
  auto qemu = SpawnDetached(rec.qemu_argv, DetachedOptions{.log = dir + "/qemu.log"});
  if (!qemu.ok()) return fail(qemu.status());
  rec.qemu = *qemu;
  instance = std::make_unique<MicrovmInstance>(spec.id, dir, rec, ctx);
  auto bridge = StartBridge(opts_.agent_path, dir);
  if (!bridge.ok()) return fail(bridge.status());
  rec.bridge = *bridge;
  instance = std::make_unique<MicrovmInstance>(spec.id, dir, rec, ctx);
  if (auto st = WriteRecord(dir, rec); !st.ok()) return fail(st);
  if (auto st = WaitForAgent(*instance, dir, opts_.boot_timeout_s, accel_); !st.ok()) return fail(st);
  return InstancePtr(std::move(instance));
}

absl::StatusOr<InstancePtr> MicrovmBackend::Adopt(const std::string& id, const Json& persisted) {
  if (!IsValidId(id, "sbx")) {
    return absl::InvalidArgumentError(fmt::format("adopt sandbox: invalid id \"{}\"", id));
  }
  (void)persisted;  // vm.json in the sandbox's dir is the record, kept with the VM itself
  const std::string dir = SandboxDir(id);
  auto rec = ReadRecord(dir);
  if (!rec.ok()) return absl::NotFoundError(fmt::format("adopt sandbox {}: {}", id, std::string(rec.status().message())));
  const ResumeContext ctx{opts_.agent_path, opts_.boot_timeout_s, accel_};
  if (rec->suspended) {
    // sbxd died while suspending or waking: the state file holds the VM; processes the record
    // still names are leftovers of that step.
    if (::access((dir + "/state").c_str(), R_OK) != 0) {
      return absl::NotFoundError(fmt::format("adopt sandbox {}: suspended, but {}/state is gone", id, dir));
    }
    Stop(rec->bridge, dir);
    Stop(rec->qemu, dir);
    rec->qemu = rec->bridge = 0;
    SBX_RETURN_IF_ERROR(WriteRecord(dir, *rec));
    return InstancePtr(std::make_unique<MicrovmInstance>(id, dir, *rec, ctx));
  }
  if (!IsOurs(rec->qemu, dir)) {
    return absl::NotFoundError(fmt::format("adopt sandbox {}: its VMM (pid {}) is gone", id, rec->qemu));
  }
  if (!IsOurs(rec->bridge, dir)) {
    // The VM outlived its bridge: a new one says hello, and the guest drops the old streams.
    auto b = StartBridge(opts_.agent_path, dir);
    if (!b.ok()) return Annotate(b.status(), fmt::format("adopt sandbox {}: restart its bridge", id));
    rec->bridge = *b;
    SBX_RETURN_IF_ERROR(WriteRecord(dir, *rec));
  }
  return InstancePtr(std::make_unique<MicrovmInstance>(id, dir, *rec, ctx));
}

absl::Status MicrovmBackend::Remove(const std::string& id) {
  if (!IsValidId(id, "sbx")) return absl::InvalidArgumentError(fmt::format("remove: invalid id \"{}\"", id));
  const std::string dir = SandboxDir(id);
  if (auto rec = ReadRecord(dir); rec.ok()) {
    Stop(rec->bridge, dir);
    Stop(rec->qemu, dir);
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
