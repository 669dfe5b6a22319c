#include "runtime/microvm/vm_instance.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "archive/upper_layer.h"
#include "common/files.h"
#include "common/process.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "net/nft_ruleset.h"
#include "protocol/protocol.h"
#include "protocol/messages.h"
#include "protocol/mux.h"
#include "agent/vm_init.h"
#include "runtime/microvm/firecracker.h"
#include "runtime/microvm/vmm.h"
#include "runtime/ns/ns_network.h"

namespace sbx::runtime::microvm {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {
// How a child we reaped ended, for error messages; the reap happens once, so the status is kept.
std::string Ended(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return "ended";
}

}  // namespace

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
  if (cmdline.find(dir + "/") != std::string::npos) return true;
  // Firecracker, exec'd by its jailer, names only paths in its chroot and the jailer's --id.
  const std::string id = JailerId(fs::path(dir).filename().string());
  return cmdline.find(std::string("--id") + '\0' + id + '\0') != std::string::npos;
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


// Our own unreaped child cannot have been replaced by another process, and its command line
// may still be empty while its exec finishes (posix_spawn returns once the child's memory is
// replaced, before its arguments are in place): only a process we did not start (adopted after
// a restart) is checked by its command line.
bool Alive(pid_t pid, const std::string& dir, std::string* ended) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) {
    if (ended != nullptr) *ended = Ended(status);
    return false;
  }
  if (r == 0) return true;
  return IsOurs(pid, dir);
}


absl::StatusOr<VmRecord> ReadRecord(const std::string& dir) {
  std::string text = ReadFileOrEmpty(dir + "/vm.json");
  Json j = Json::parse(text, nullptr, false);
  // Records written before the VMM drivers name QEMU's pid and command line as such.
  const char* pid_key = j.is_object() && j.contains("vmm_pid") ? "vmm_pid" : "qemu_pid";
  const char* argv_key = j.is_object() && j.contains("vmm_argv") ? "vmm_argv" : "qemu_argv";
  if (!j.is_object() || !j.contains(pid_key) || !j[pid_key].is_number_integer() ||
      !j.contains("bridge_pid") || !j["bridge_pid"].is_number_integer()) {
    return absl::NotFoundError(fmt::format("{}/vm.json: no pids", dir));
  }
  VmRecord r;
  r.vmm = j.value("vmm", std::string("qemu"));
  r.vmm_pid = j[pid_key].get<pid_t>();
  r.bridge = j["bridge_pid"].get<pid_t>();
  r.suspended = j.value("suspended", false);
  r.migratable = j.value("migratable", false);
  r.uid = j.value("uid", uint32_t{0});
  r.vcpus = j.value("vcpus", int64_t{1});
  r.memory_mib = j.value("memory_mib", int64_t{0});
  if (j.contains(argv_key) && j[argv_key].is_array()) {
    for (const auto& a : j[argv_key]) {
      if (a.is_string()) r.vmm_argv.push_back(a.get<std::string>());
    }
  }
  return r;
}

absl::Status WriteRecord(const std::string& dir, const VmRecord& r) {
  const std::string tmp = dir + "/vm.json.tmp";
  const Json record{{"vmm", r.vmm}, {"vmm_pid", r.vmm_pid}, {"bridge_pid", r.bridge},
                    {"suspended", r.suspended}, {"migratable", r.migratable}, {"vmm_argv", r.vmm_argv},
                    {"uid", r.uid}, {"vcpus", r.vcpus}, {"memory_mib", r.memory_mib}};
  SBX_RETURN_IF_ERROR(WriteFileContents(tmp, record.dump() + "\n"));
  if (::rename(tmp.c_str(), (dir + "/vm.json").c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("rename({}, vm.json)", tmp));
  }
  return absl::OkStatus();
}

std::string VmmLog(const std::string& dir, const VmRecord& rec) { return fmt::format("{}/{}.log", dir, rec.vmm); }

absl::StatusOr<pid_t> StartBridge(const std::string& agent, const std::string& dir, const GuestLink& link,
                                  uint32_t uid) {
  std::vector<std::string> argv = {agent, "--vm-bridge", link.socket, dir + "/agent.sock"};
  if (!link.connect_line.empty()) argv.push_back(link.connect_line);
  if (uid != 0) argv.insert(argv.end(), {"--as-uid", std::to_string(uid)});
  return SpawnDetached(argv, DetachedOptions{.log = dir + "/bridge.log"});
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
          std::string(ping.status().message()), FileTail(dir + "/vmm/console.log", 400)));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, 50ms);
  }
}

namespace {

// A build step's layer export: the guest walks its upper and streams it (120 s per frame at
// most, as the agent's own file I/O bound).
constexpr int kExportIoTimeoutMs = 120000;

class MicrovmInstance : public Instance {
 public:
  MicrovmInstance(std::string id, std::string dir, VmRecord rec, std::unique_ptr<Vmm> vmm,
                  ResumeContext ctx, std::unique_ptr<net::SandboxNetwork> network = nullptr)
      : id_(std::move(id)), dir_(std::move(dir)), rec_(std::move(rec)), vmm_(std::move(vmm)),
        ctx_(std::move(ctx)), network_(std::move(network)) {}
  ~MicrovmInstance() override {
    // sbxd stops and the VM runs on: its tap stays for the next sbxd to adopt.
    if (network_) network_->Release();
  }

  const std::string& id() const override { return id_; }
  std::string AgentSocketPath() const override { return dir_ + "/agent.sock"; }
  Json Persist() const override {
    const VmRecord rec = Rec();
    return Json{{"dir", dir_},
                {"vmm", rec.vmm},
                {"vmm_pid", rec.vmm_pid},
                {"bridge_pid", rec.bridge},
                {"suspended", rec.suspended},
                {"networked", network_ != nullptr},
                {"egress", ns::NetworkPolicyJson(network_.get())}};
  }
  // Through the bridge's ports.sock (protocol/mux.h, kOpen's port target) to the guest's own
  // loopback, as the ns runtime dials a sandbox's: a server listening on 127.0.0.1 is reached,
  // and a VM without a NIC too.
  absl::StatusOr<UniqueFd> DialPort(uint16_t port, bool ipv6) const override {
    if (Rec().suspended) return absl::FailedPreconditionError(fmt::format("dial port {}: suspended", id_));
    const std::string path = dir_ + "/" + agent::kBridgePortsSocket;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoStatus(errno, "dial port: socket");
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(errno, fmt::format("dial port {}: connect({})", port, path));
    }
    const char target[protocol::kMuxPortOpenBytes] = {static_cast<char>(port >> 8), static_cast<char>(port & 0xff),
                                                      static_cast<char>(ipv6 ? 6 : 4)};
    if (::send(fd.get(), target, sizeof(target), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(target))) {
      return ErrnoStatus(errno, fmt::format("dial port {}: send to the bridge", port));
    }
    pollfd p{fd.get(), POLLIN, 0};
    char ok = 0;
    const int ready = ::poll(&p, 1, 10000);
    if (ready == 0) return absl::DeadlineExceededError(fmt::format("dial port {}: the guest did not answer in 10 s", port));
    if (ready < 0 || ::recv(fd.get(), &ok, 1, 0) != 1 || ok != 1) {
      // The guest's connect was refused: nothing listens there.
      return absl::UnavailableError(fmt::format("dial port {}: refused in the guest ({})", port, ipv6 ? "[::1]" : "127.0.0.1"));
    }
    return fd;
  }
  // The guest's agent ends the step's leftover processes and streams its overlay's upper
  // (agent/export_layer.cc); what arrives is the guest's word, so it is hashed here, bounded by
  // the disk it came from, and unpacked by the layer store like any layer sbxd did not make.
  absl::StatusOr<ExportedLayer> ExportWritableLayer(int out_fd, const std::function<bool()>& cancelled,
                                                    uint64_t max_entries) override {
    const VmRecord rec = Rec();
    if (!rec.keep_writable_layer || rec.suspended) {
      return absl::FailedPreconditionError(fmt::format(
          "export writable layer {}: not a running build step's VM (keep_writable_layer)", id_));
    }
    auto done = [&](const absl::Status& s) { return Annotate(s, fmt::format("export writable layer {}", id_)); };
    auto conn = protocol::AgentConnection::Connect(AgentSocketPath(), kExportIoTimeoutMs);
    if (!conn.ok()) return done(conn.status());
    protocol::ExportLayerRequest req;
    req.max_entries = std::max<uint64_t>(max_entries, 1);
    if (auto r = conn->Call(req.ToJson()); !r.ok()) return done(r.status());
    // Every entry costs at most a header and a long name's extension (3 blocks); the files'
    // bytes fit the disk they were on.
    const uint64_t headers = std::min<uint64_t>(max_entries, uint64_t{1} << 24) * 1536;
    archive::LayerTarFile file(out_fd, (static_cast<uint64_t>(std::max<int64_t>(rec.disk_mib, 0)) << 20) + headers + (1 << 20));
    for (;;) {
      if (cancelled && cancelled()) return absl::CancelledError(fmt::format("export writable layer {}: cancelled", id_));
      auto f = conn->ReadFrame();
      if (!f.ok()) return done(f.status());
      if (f->type == protocol::FrameType::kData) {
        if (absl::Status w = file.Write(f->payload); !w.ok()) return done(w);
        continue;
      }
      if (f->type != protocol::FrameType::kEnd) {
        return done(absl::InternalError(fmt::format("the agent sent frame type {} in a layer", static_cast<int>(f->type))));
      }
      auto j = protocol::ParseObjectPayload(f->payload, "export_layer end");
      if (!j.ok()) return done(j.status());
      if (absl::Status s = protocol::ReplyStatus(*j, "export_layer end"); !s.ok()) return done(s);
      auto end = protocol::ExportLayerEnd::FromJson(*j);
      if (!end.ok()) return done(end.status());
      if (end->tar_bytes != file.bytes()) {
        return done(absl::DataLossError(fmt::format("the agent counted {} bytes, {} arrived", end->tar_bytes, file.bytes())));
      }
      return ExportedLayer{file.Digest(), file.bytes(), std::min(end->entries, max_entries)};
    }
  }
  absl::StatusOr<std::map<std::string, uint64_t>> DeniedEgress() const override {
    if (!network_ || ctx_.network == nullptr) {
      // No NIC at all: nothing leaves, and the guest's kernel keeps its own refusals.
      return absl::UnimplementedError("denied egress: a microVM without a network counts nothing");
    }
    auto counts = ctx_.network->Denials(id_);
    if (!counts.ok()) return counts.status();
    for (const auto& [reason, n] : ctx_.network->denials_log().Counts(id_)) (*counts)[reason] += n;
    return *counts;
  }
  bool Alive() const override {
    // Suspended (or on the way there: marked before QEMU is told to quit), nothing runs and
    // nothing is lost: the state is on disk.
    if (Rec().suspended) return true;
    return ProcAlive(true) && ProcAlive(false);
  }
  std::string DeathReason() const override {
    // The bridge ends when QEMU's end of the port closes, often before QEMU has exited and
    // its console file holds the guest's last words: give QEMU a moment to finish.
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (ProcAlive(true) && !ProcAlive(false) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    // QEMU writes the guest's console to its own file; Firecracker to its stdout (its log).
    std::string console = FileTail(dir_ + "/vmm/console.log", 2000);
    if (console.empty()) console = FileTail(VmmLog(dir_, Rec()), 2000);
    if (const size_t p = console.find("Kernel panic"); p != std::string::npos) {
      return "the guest kernel panicked: " + Tail(console.substr(p, console.find('\n', p) - p), 300);
    }
    if (const size_t p = console.find("sbx-init: "); p != std::string::npos) {
      return "the guest's init failed: " + Tail(console.substr(p, console.find('\n', p) - p), 300);
    }
    const std::string log = FileTail(VmmLog(dir_, Rec()), 300);
    if (!ProcAlive(true) || !log.empty()) {
      const std::string ended = EndedOf(true);
      return fmt::format("the VMM ({}) exited ({}){}{}", vmm_->Name(), ended.empty() ? "not our child" : ended,
                         log.empty() ? "" : ": " + log,
                         console.empty() ? "" : "; guest console: " + Tail(console, 300));
    }
    const std::string bridge = FileTail(dir_ + "/bridge.log", 300);
    const std::string ended = EndedOf(false);
    return fmt::format("the VM's agent bridge exited ({}){}", ended.empty() ? "not our child" : ended,
                       bridge.empty() ? std::string() : ": " + bridge);
  }
  absl::Status Destroy() override {
    const VmRecord rec = Rec();
    Stop(rec.bridge, dir_);
    Stop(rec.vmm_pid, dir_);
    if (network_) {
      SBX_RETURN_IF_ERROR(Annotate(network_->Destroy(), fmt::format("destroy {}: network", id_)));
      network_.reset();
    }
    if (ctx_.cgroups != nullptr) {
      SBX_RETURN_IF_ERROR(Annotate(ctx_.cgroups->Existing(id_)->Destroy(), fmt::format("destroy {}: the VMM's cgroup", id_)));
    }
    if (ctx_.uids != nullptr && rec.uid != 0) {
      SBX_RETURN_IF_ERROR(Annotate(ctx_.uids->Release(rec.uid, dir_), fmt::format("destroy {}: the VMM's uid", id_)));
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (ec) return absl::InternalError(fmt::format("destroy {}: remove {}: {}", id_, dir_, ec.message()));
    return absl::OkStatus();
  }
  // The VMM stops the vCPUs: nothing in the guest runs, its memory stays resident.
  absl::Status Freeze() override {
    if (Rec().suspended) return absl::OkStatus();
    return Annotate(vmm_->Pause(), fmt::format("pause {}", id_));
  }
  absl::Status Thaw() override { return Resume(); }
  absl::StatusOr<bool> IsFrozen() const override {
    if (Rec().suspended) return true;
    SBX_ASSIGN_OR_RETURN(bool running, vmm_->Running());
    return !running;
  }

  // The VM's whole state (memory, vCPUs, devices) goes to <dir>/state (the driver's format),
  // then the VMM and the bridge exit: the host has the guest's memory back. A VM with a 9p share
  // mounted cannot be migrated (QEMU refuses), so it is paused instead.
  absl::StatusOr<SuspendOutcome> Suspend() override {
    if (Rec().suspended) {
      return SuspendOutcome{.memory_released = true, .how = "already saved to disk", .snapshot_bytes = StateBytes()};
    }
    SBX_RETURN_IF_ERROR(Freeze());
    if (!Rec().migratable) {
      return SuspendOutcome{.how = "paused with its memory resident: the template shares host directories "
                                   "with the VM (9p), and QEMU cannot save a VM that has them mounted"};
    }
    const std::string state = dir_ + "/state";
    auto saved = vmm_->Save(state, 300s);
    if (!saved.ok()) return Annotate(saved.status(), fmt::format("suspend {}: save the VM (it stays paused)", id_));
    // The record says "suspended" before any process ends: a crash from here on wakes from
    // the file, which holds everything (adoption stops the processes the record still names).
    VmRecord next = Rec();
    next.suspended = true;
    if (auto st = WriteRecord(dir_, next); !st.ok()) {
      ::unlink(state.c_str());
      return Annotate(st, fmt::format("suspend {} (the VM stays paused)", id_));
    }
    // Suspended from here on, also for the threads asking Alive(): the VM's connections break
    // now, and that must not read as a dead agent.
    SetRec(next);
    vmm_->Quit();
    Stop(next.vmm_pid, dir_);
    Stop(next.bridge, dir_);
    next.vmm_pid = next.bridge = 0;
    (void)WriteRecord(dir_, next);
    {
      std::lock_guard lock(mu_);
      rec_ = next;
      vmm_ended_.clear();
      bridge_ended_.clear();
    }
    return SuspendOutcome{.memory_released = true,
                          .how = fmt::format("saved to the host's disk with the VM's devices; the VMM ({}) "
                                             "exited, so the host has the guest's memory back",
                                             vmm_->Name()),
                          .snapshot_bytes = *saved};
  }

  // From a pause: the vCPUs continue. From a suspend: a new VMM with the same devices loads
  // the saved state, a new bridge says hello (the guest drops the streams of the old one), and
  // the state goes once the agent answers.
  absl::Status Resume() override {
    const VmRecord before = Rec();
    if (!before.suspended) return Annotate(vmm_->Continue(), fmt::format("wake {}", id_));
    if (before.vmm_argv.empty()) {
      return absl::FailedPreconditionError(fmt::format("wake {}: vm.json has no VMM command line", id_));
    }
    const std::string state = dir_ + "/state";
    if (ctx_.cgroups != nullptr && before.memory_mib > 0) {
      // After a host reboot the VMM's cgroup is gone with the rest of the cgroup tree.
      const auto dirs = ctx_.cgroups->SandboxDirs(id_);
      if (!dirs.empty() && ::access(dirs.front().path.c_str(), F_OK) != 0) {
        auto cg = ctx_.cgroups->Create(id_, VmCgroupLimits(before.vcpus, before.memory_mib));
        if (!cg.ok()) return Annotate(cg.status(), fmt::format("wake {}: the VMM's cgroup", id_));
        (*cg)->Release();
      }
    }
    auto start = vmm_->Restore(before.vmm_argv, state);
    if (!start.ok()) return Annotate(start.status(), fmt::format("wake {}", id_));
    auto pid = SpawnDetached(start->argv, DetachedOptions{.log = VmmLog(dir_, before), .pass_fd = start->fd3.get()});
    if (!pid.ok()) return Annotate(pid.status(), fmt::format("wake {}", id_));
    start->fd3.Reset();
    VmRecord live = before;
    live.vmm_pid = *pid;
    auto undo = [&](absl::Status st) {
      Stop(live.bridge, dir_);
      Stop(live.vmm_pid, dir_);
      SetRec(before);
      (void)WriteRecord(dir_, before);
      return Annotate(st, fmt::format("wake {} (it stays suspended)", id_));
    };
    // Still suspended (the file is the truth until the agent answers), but a crash from here
    // leaves processes that adoption must stop: the record names them.
    if (auto st = WriteRecord(dir_, live); !st.ok()) return undo(st);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(ctx_.boot_timeout_s);
    auto alive = [&]() -> absl::Status {
      std::string ended;
      if (microvm::Alive(live.vmm_pid, dir_, &ended)) return absl::OkStatus();
      return absl::UnavailableError(fmt::format("the VMM exited ({}): {}", ended, FileTail(VmmLog(dir_, live), 300)));
    };
    if (auto st = vmm_->AwaitLoaded(state, alive, deadline); !st.ok()) return undo(st);
    auto bridge = StartBridge(ctx_.agent_path, dir_, vmm_->Link(), live.uid);
    if (!bridge.ok()) return undo(bridge.status());
    live.bridge = *bridge;
    if (auto st = WriteRecord(dir_, live); !st.ok()) return undo(st);
    if (auto st = vmm_->Continue(); !st.ok()) return undo(st);
    live.suspended = false;
    SetRec(live);
    if (auto st = WaitForAgent(*this, dir_, ctx_.boot_timeout_s, ctx_.accel); !st.ok()) return undo(st);
    if (auto st = WriteRecord(dir_, live); !st.ok()) return undo(st);
    RemoveState();
    return absl::OkStatus();
  }

 private:
  // The record changes in Suspend and Resume (one job at a time) while other threads ask
  // Alive(), Persist() and DialPort(): copies under mu_.
  VmRecord Rec() const {
    std::lock_guard lock(mu_);
    return rec_;
  }
  void SetRec(const VmRecord& r) {
    std::lock_guard lock(mu_);
    rec_ = r;
  }
  // Whether the VMM (or the bridge) of the current record runs; how it ended is kept once
  // reaped.
  bool ProcAlive(bool vmm) const {
    std::lock_guard lock(mu_);
    return microvm::Alive(vmm ? rec_.vmm_pid : rec_.bridge, dir_, vmm ? &vmm_ended_ : &bridge_ended_);
  }
  std::string EndedOf(bool vmm) const {
    std::lock_guard lock(mu_);
    return vmm ? vmm_ended_ : bridge_ended_;
  }
  // The saved state: `state` and the driver's `state.*` beside it.
  int64_t StateBytes() const {
    int64_t total = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name == "state" || name.starts_with("state.")) total += static_cast<int64_t>(e.file_size(ec));
    }
    return total;
  }
  void RemoveState() const {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name == "state" || name.starts_with("state.")) fs::remove(e.path(), ec);
    }
  }

  std::string id_;
  std::string dir_;
  VmRecord rec_;
  std::unique_ptr<Vmm> vmm_;  // the driver named by rec_.vmm
  ResumeContext ctx_;
  std::unique_ptr<net::SandboxNetwork> network_;  // networked sandboxes only
  mutable std::mutex mu_;
  mutable std::string vmm_ended_, bridge_ended_;  // how each ended, once reaped here
};

}  // namespace

ns::CgroupLimits VmCgroupLimits(int64_t vcpus, int64_t memory_mib) {
  ns::CgroupLimits l;
  l.memory_bytes = (memory_mib + 256) << 20;
  l.pids = 1024;  // QEMU's threads: vCPUs, the I/O thread pool, RCU, the main loop
  l.cpu_period_us = 100000;
  l.cpu_quota_us = vcpus * 100000 + 50000;
  return l;
}

absl::StatusOr<InstancePtr> NewMicrovmInstance(std::string id, std::string dir, VmRecord rec, ResumeContext ctx,
                                               std::unique_ptr<net::SandboxNetwork> network) {
  SBX_ASSIGN_OR_RETURN(std::unique_ptr<Vmm> vmm, OpenVmm(rec.vmm, dir));
  return InstancePtr(std::make_unique<MicrovmInstance>(std::move(id), std::move(dir), std::move(rec), std::move(vmm),
                                                       std::move(ctx), std::move(network)));
}

}  // namespace sbx::runtime::microvm
