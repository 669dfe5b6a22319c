#include "runtime/microvm/qemu.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/json_util.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::runtime::microvm {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// QEMU's option syntax: a comma inside a value is written twice.
std::string Esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == ',') out += ',';
  }
  return out;
}

class QmpConn {
 public:
  QmpConn(UniqueFd fd, Clock::time_point deadline) : fd_(std::move(fd)), deadline_(deadline) {}

  // The next JSON object QEMU sends that is not an event.
  absl::StatusOr<Json> Next() {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        // QEMU parses what the guest writes to its devices: a compromised one may answer
        // anything, so its lines are untrusted JSON (bounded depth, no exceptions).
        absl::StatusOr<Json> parsed = ParseUntrustedJson(line);
        if (!parsed.ok() || !parsed->is_object()) {
          return absl::InternalError(fmt::format("qmp: not a JSON object: {}", line.substr(0, 200)));
        }
        Json j = std::move(*parsed);
        if (j.contains("event")) continue;
        return j;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) return absl::UnavailableError("qmp: no answer in time");
      pollfd p{fd_.get(), POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return absl::UnavailableError("qmp: no answer in time");
      char tmp[4096];
      const ssize_t r = ::read(fd_.get(), tmp, sizeof(tmp));
      if (r == 0) return absl::UnavailableError("qmp: QEMU closed the socket");
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoStatus(errno, "qmp: read");
      }
      buf_.append(tmp, static_cast<size_t>(r));
      if (buf_.size() > (1u << 20)) return absl::InternalError("qmp: answer over 1 MiB");
    }
  }

  // `pass_fd` >= 0 travels with the command (SCM_RIGHTS), for `getfd`.
  absl::StatusOr<Json> Execute(const std::string& command, const Json& arguments, int pass_fd = -1) {
    Json req = {{"execute", command}};
    if (!arguments.is_null()) req["arguments"] = arguments;
    const std::string line = req.dump() + "\n";
    iovec iov{const_cast<char*>(line.data()), line.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    if (::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
      return ErrnoStatus(errno, fmt::format("qmp: send {}", command));
    }
    SBX_ASSIGN_OR_RETURN(Json ans, Next());
    if (ans.contains("error")) {
      return absl::FailedPreconditionError(
          fmt::format("qmp {}: {}", command, ans["error"].value("desc", ans["error"].dump())));
    }
    if (!ans.contains("return")) {
      return absl::InternalError(fmt::format("qmp {}: unexpected answer {}", command, ans.dump()));
    }
    return ans["return"];
  }

 private:
  UniqueFd fd_;
  Clock::time_point deadline_;
  std::string buf_;
};

}  // namespace

std::vector<std::string> QemuArgv(const QemuVm& vm) {
  std::vector<std::string> a = {
      vm.qemu,
      // pit, pic and rtc: without them a stock kernel under TCG hangs at "Marking TSC unstable"
      // (research/feasibility.md, row 8c).
      "-M", "microvm,pit=on,pic=on,rtc=on",
      // TCG's translated-code cache is 1 GiB by default, and a guest fills tens of MiB of it
      // while booting: 64 MiB bounds that per-VM cost with no slower boot here.
      "-accel", vm.accel == "tcg" ? "tcg,tb-size=64" : vm.accel,
      "-cpu", vm.accel == "kvm" ? "host" : "max",
      "-smp", std::to_string(vm.vcpus),
      "-m", fmt::format("{}M", vm.memory_mib),
      "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
      // QEMU's own seccomp filter: no exec, no setuid, no new privileges for the VMM.
      "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
      "-kernel", vm.vmlinux,
      "-initrd", vm.initramfs,
      // panic=-1: a guest panic reboots at once, which -no-reboot turns into QEMU's exit.
      "-append", "console=ttyS0 panic=-1 quiet" + (vm.extra_cmdline.empty() ? "" : " " + vm.extra_cmdline),
      "-serial", "file:" + vm.console_log,
      "-device", "virtio-serial-device",
      "-chardev", fmt::format("socket,id=agent,path={},server=on,wait=off", Esc(vm.serial_socket)),
      "-device", "virtserialport,chardev=agent,name=sbx.agent",
      "-qmp", fmt::format("unix:{},server=on,wait=off", Esc(vm.qmp_socket)),
  };
  int d = 0;
  for (const auto& disk : vm.disks) {
    const std::string id = fmt::format("disk{}", d++);
    a.push_back("-drive");
    a.push_back(fmt::format("file={},format=raw,if=none,id={},cache=none,aio=threads{}", Esc(disk.path), id,
                            disk.read_only ? ",readonly=on" : ""));
    a.push_back("-device");
    a.push_back(fmt::format("virtio-blk-device,drive={},serial={}", id, disk.serial));
  }
  if (!vm.tap.empty()) {
    // The tap exists (persistent, made by sbxd); the VMM's jail opens it as fd 4 before it
    // leaves the host's network namespace, so QEMU only uses it.
    a.push_back("-netdev");
    a.push_back("tap,id=net0,fd=4");
    a.push_back("-device");
    a.push_back(fmt::format("virtio-net-device,netdev=net0,mac={}", vm.mac));
  }
  if (vm.incoming_fd3) {
    a.push_back("-incoming");
    a.push_back("fd:3");
  }
  int i = 0;
  for (const auto& s : vm.shares) {
    const std::string id = fmt::format("fs{}", i++);
    a.push_back("-fsdev");
    a.push_back(fmt::format("local,id={},path={},security_model=none,readonly=on", id, Esc(s.host_path)));
    a.push_back("-device");
    a.push_back(fmt::format("virtio-9p-device,fsdev={},mount_tag={}", id, s.tag));
  }
  return a;
}

std::string TcgKernelParams(const std::string& cpuinfo, const std::string& kernel_config) {
  const size_t at = cpuinfo.find("cpu MHz");
  if (at == std::string::npos) return {};
  const size_t colon = cpuinfo.find(':', at);
  if (colon == std::string::npos) return {};
  const double mhz = std::strtod(cpuinfo.c_str() + colon + 1, nullptr);
  if (!(mhz > 100 && mhz < 100000)) return {};
  const auto khz = static_cast<int64_t>(mhz * 1000);
  std::string out = fmt::format("tsc_early_khz={} no_timer_check", khz);
  const size_t hz_at = kernel_config.find("\nCONFIG_HZ=");
  if (hz_at != std::string::npos) {
    const long hz = std::strtol(kernel_config.c_str() + hz_at + 11, nullptr, 10);
    if (hz >= 100 && hz <= 1000) out += fmt::format(" lpj={}", khz * 1000 / hz);
  }
  return out;
}

namespace {

// A QMP connection past its greeting and capabilities negotiation.
absl::StatusOr<QmpConn> OpenQmp(const std::string& socket, Clock::time_point deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(fmt::format("qmp: socket path {} is too long", socket));
  }
  std::memcpy(addr.sun_path, socket.data(), socket.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "qmp: socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, fmt::format("qmp: connect({})", socket));
  }
  QmpConn c(std::move(fd), deadline);
  SBX_ASSIGN_OR_RETURN(Json greeting, c.Next());
  if (!greeting.contains("QMP")) {
    return absl::InternalError(fmt::format("qmp: no greeting: {}", greeting.dump()));
  }
  SBX_RETURN_IF_ERROR(c.Execute("qmp_capabilities", nullptr).status());
  return c;
}

}  // namespace

absl::StatusOr<Json> QmpCommand(const std::string& socket, const std::string& command,
                                const Json& arguments, std::chrono::milliseconds timeout) {
  SBX_ASSIGN_OR_RETURN(QmpConn c, OpenQmp(socket, Clock::now() + timeout));
  return c.Execute(command, arguments);
}

absl::StatusOr<Json> QmpSaveState(const std::string& socket, int fd, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  SBX_ASSIGN_OR_RETURN(QmpConn c, OpenQmp(socket, deadline));
  SBX_RETURN_IF_ERROR(c.Execute("getfd", Json{{"fdname", "sbxstate"}}, fd).status());
  SBX_RETURN_IF_ERROR(c.Execute("migrate", Json{{"uri", "fd:sbxstate"}}).status());
  // The VM is stopped, so the whole state goes in one pass; QEMU answers query-migrate while
  // it writes.
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    SBX_ASSIGN_OR_RETURN(Json st, c.Execute("query-migrate", nullptr));
    const std::string status = st.value("status", std::string());
    if (status == "completed") return st;
    if (status == "failed" || status == "cancelled") {
      return absl::InternalError(fmt::format("qmp migrate: {}: {}", status, st.value("error-desc", std::string("no reason given"))));
    }
    if (Clock::now() >= deadline) {
      (void)c.Execute("migrate_cancel", nullptr);
      return absl::DeadlineExceededError(fmt::format("qmp migrate: still {} after {} ms", status, timeout.count()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

namespace {

// QMP on <dir>/vmm/qmp.sock; the agent's port on <dir>/vmm/serial.sock.
class QemuVmm : public Vmm {
 public:
  explicit QemuVmm(std::string dir) : dir_(std::move(dir)), qmp_(dir_ + "/vmm/qmp.sock") {}

  std::string Name() const override { return "qemu"; }
  absl::Status Pause() const override { return QmpCommand(qmp_, "stop").status(); }
  absl::Status Continue() const override { return QmpCommand(qmp_, "cont").status(); }
  absl::StatusOr<bool> Running() const override {
    SBX_ASSIGN_OR_RETURN(Json st, QmpCommand(qmp_, "query-status"));
    return st.value("status", std::string()) == "running";
  }

  // One migration stream, written through a descriptor QEMU gets over the socket: its jail
  // cannot open the file itself.
  absl::StatusOr<int64_t> Save(const std::string& state, std::chrono::seconds timeout) const override {
    const std::string tmp = state + ".tmp";
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoStatus(errno, fmt::format("open({})", tmp));
    auto saved = QmpSaveState(qmp_, fd.get(), timeout);
    if (!saved.ok()) {
      ::unlink(tmp.c_str());
      return saved.status();
    }
    struct stat st{};
    if (::fsync(fd.get()) != 0 || ::fstat(fd.get(), &st) != 0 || ::rename(tmp.c_str(), state.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return ErrnoStatus(e, fmt::format("keep {}", state));
    }
    return static_cast<int64_t>(st.st_size);
  }
  void Quit() const override { (void)QmpCommand(qmp_, "quit"); }

  absl::StatusOr<RestoreStart> Restore(const std::vector<std::string>& boot_argv,
                                       const std::string& state) const override {
    RestoreStart r;
    r.fd3 = UniqueFd(::open(state.c_str(), O_RDONLY | O_CLOEXEC));
    if (!r.fd3.valid()) return ErrnoStatus(errno, fmt::format("open({})", state));
    r.argv = boot_argv;
    r.argv.push_back("-incoming");
    r.argv.push_back("fd:3");
    return r;
  }
  // QEMU answers QMP once it listens; the load runs before the VM may continue.
  absl::Status AwaitLoaded(const std::string& state, const std::function<absl::Status()>& alive,
                           std::chrono::steady_clock::time_point deadline) const override {
    for (auto pause = std::chrono::milliseconds(2);; pause = std::min(pause * 2, std::chrono::milliseconds(20))) {
      auto st = QmpCommand(qmp_, "query-status");
      if (st.ok() && st->value("status", std::string()) != "inmigrate") return absl::OkStatus();
      SBX_RETURN_IF_ERROR(Annotate(alive(), fmt::format("QEMU loading {}", state)));
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(fmt::format("QEMU did not load {} in time", state));
      }
      std::this_thread::sleep_for(pause);
    }
  }

  GuestLink Link() const override { return {dir_ + "/vmm/serial.sock", ""}; }

 private:
  std::string dir_;
  std::string qmp_;
};

}  // namespace

std::unique_ptr<Vmm> NewQemuVmm(const std::string& vm_dir) { return std::make_unique<QemuVmm>(vm_dir); }

}  // namespace sbx::runtime::microvm
