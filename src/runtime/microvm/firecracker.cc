#include "runtime/microvm/firecracker.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include <curl/curl.h>
#include <fmt/format.h>

#include "common/curl_init.h"
#include "common/files.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "agent/vm_init.h"

namespace sbx::runtime::microvm {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr char kApiSock[] = "/api.sock";       // inside the chroot
constexpr char kVsockUds[] = "/v.sock";
constexpr char kConfigFile[] = "/vm-config.json";
constexpr char kSnapFile[] = "/state.snap";
constexpr char kMemFile[] = "/state.mem";

// Firecracker's answers are a few hundred bytes of JSON; the VMM runs a guest, so what it says
// is held only up to this much (returning short makes curl fail the transfer).
constexpr size_t kMaxApiResponse = 64 * 1024;

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (s->size() + size * n > kMaxApiResponse) return 0;
  s->append(data, size * n);
  return size * n;
}

// A hard link in the chroot (the VMM sees no path outside it), replacing an older one.
absl::Status LinkInto(const std::string& src, const std::string& dst) {
  ::unlink(dst.c_str());
  if (::link(src.c_str(), dst.c_str()) != 0) return ErrnoStatus(errno, fmt::format("link({}, {})", src, dst));
  return absl::OkStatus();
}

absl::Status Fsync(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0) return ErrnoStatus(errno, fmt::format("fsync({})", path));
  return absl::OkStatus();
}

}  // namespace

std::string JailerId(const std::string& sandbox_id) {
  std::string id = sandbox_id;
  for (char& c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  }
  return id;
}

std::string FirecrackerRoot(const std::string& vm_dir) {
  return fmt::format("{}/fc/firecracker/{}/root", vm_dir, JailerId(fs::path(vm_dir).filename().string()));
}

Json FirecrackerConfig(const FirecrackerVm& vm) {
  // Its console on ttyS0 (Firecracker's stdout: the VMM's log), no PCI (virtio-mmio only), a
  // panic reboots, and a reboot (reboot=k) ends Firecracker; disks are known by order.
  Json boot = {{"kernel_image_path", "/vmlinux"},
               {"initrd_path", "/initramfs"},
               {"boot_args", "console=ttyS0 reboot=k panic=1 pci=off quiet sbx.disks=order" +
                                 (vm.cmdline.empty() ? "" : " " + vm.cmdline)}};
  Json drives = Json::array();
  for (size_t i = 0; i < vm.drives.size(); ++i) {
    drives.push_back({{"drive_id", fmt::format("drive{}", i)},
                      {"path_on_host", fmt::format("/drive{}", i)},
                      {"is_root_device", false},
                      {"is_read_only", vm.drives[i].read_only}});
  }
  Json cfg = {{"boot-source", boot},
              {"drives", drives},
              {"machine-config", {{"vcpu_count", vm.vcpus}, {"mem_size_mib", vm.memory_mib}, {"smt", false}}},
              {"vsock", {{"guest_cid", kGuestVsockCid}, {"uds_path", kVsockUds}}}};
  if (!vm.tap.empty()) {
    cfg["network-interfaces"] = Json::array({{{"iface_id", "eth0"}, {"host_dev_name", vm.tap}, {"guest_mac", vm.mac}}});
  }
  return cfg;
}

std::vector<std::string> JailerArgv(const FirecrackerVm& vm, bool with_config) {
  std::vector<std::string> a = {vm.jailer,
                                "--id", JailerId(vm.sandbox_id),
                                "--exec-file", vm.firecracker,
                                "--uid", std::to_string(vm.uid),
                                "--gid", std::to_string(vm.uid),
                                "--chroot-base-dir", vm.vm_dir + "/fc"};
  // No --new-pid-ns nor --daemonize: the jailer then execs Firecracker in its own process,
  // whose pid vm.json keeps. The jail before it bounds the files it writes (RLIMIT_FSIZE); said
  // again here, since the jailer sets the limits it is given. Firecracker exits on SIGXFSZ
  // (code 151) where QEMU gets EFBIG and lives on.
  if (vm.max_file_bytes > 0) {
    a.push_back("--resource-limit");
    a.push_back(fmt::format("fsize={}", vm.max_file_bytes));
  }
  for (const char* arg : {"--", "--api-sock", kApiSock}) a.push_back(arg);
  if (with_config) {
    a.push_back("--config-file");
    a.push_back(kConfigFile);
  }
  return a;
}

absl::StatusOr<std::vector<std::string>> PrepareFirecracker(const FirecrackerVm& vm) {
  const std::string root = FirecrackerRoot(vm.vm_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::InternalError(fmt::format("firecracker: mkdir {}: {}", root, ec.message()));
  SBX_RETURN_IF_ERROR(LinkInto(vm.vmlinux, root + "/vmlinux"));
  SBX_RETURN_IF_ERROR(LinkInto(vm.initramfs, root + "/initramfs"));
  for (size_t i = 0; i < vm.drives.size(); ++i) {
    SBX_RETURN_IF_ERROR(LinkInto(vm.drives[i].host_path, fmt::format("{}/drive{}", root, i)));
  }
  SBX_RETURN_IF_ERROR(Annotate(WriteFileContents(root + kConfigFile, FirecrackerConfig(vm).dump(2)),
                               "firecracker"));
  // The VMM writes its sockets and a suspend's files in its root.
  if (::chown(root.c_str(), vm.uid, vm.uid) != 0) return ErrnoStatus(errno, fmt::format("chown({})", root));
  return JailerArgv(vm, true);
}

absl::StatusOr<std::string> FirecrackerRequest(const std::string& socket, const std::string& method,
                                               const std::string& path, const Json& body,
                                               std::chrono::milliseconds timeout) {
  CURL* c = CurlEasyInit();
  if (c == nullptr) return absl::InternalError("firecracker api: curl_easy_init failed");
  std::string response;
  const std::string payload = body.is_null() ? std::string() : body.dump();
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Accept: application/json");
  curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, socket.c_str());
  curl_easy_setopt(c, CURLOPT_URL, ("http://localhost" + path).c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (!body.is_null()) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
  }
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
  const CURLcode rc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(fmt::format("firecracker api: {} {} on {}: {}", method, path, socket,
                                              curl_easy_strerror(rc)));
  }
  if (code < 200 || code > 299) {
    // {"fault_message": "..."}: Firecracker's own words, bounded (it is the VMM's, not ours).
    std::string why = response.substr(0, 500);
    if (auto j = ParseUntrustedJson(response); j.ok() && j->is_object() && j->contains("fault_message") &&
                                               (*j)["fault_message"].is_string()) {
      why = (*j)["fault_message"].get<std::string>().substr(0, 500);
    }
    return absl::FailedPreconditionError(fmt::format("firecracker api: {} {}: HTTP {}: {}", method, path, code, why));
  }
  return response;
}

namespace {

class FirecrackerVmm : public Vmm {
 public:
  explicit FirecrackerVmm(std::string dir)
      : dir_(std::move(dir)), root_(FirecrackerRoot(dir_)), api_(root_ + kApiSock) {}

  std::string Name() const override { return "firecracker"; }
  absl::Status Pause() const override { return Call("PATCH", "/vm", {{"state", "Paused"}}); }
  absl::Status Continue() const override { return Call("PATCH", "/vm", {{"state", "Resumed"}}); }
  absl::StatusOr<bool> Running() const override {
    SBX_ASSIGN_OR_RETURN(std::string text, FirecrackerRequest(api_, "GET", "/", nullptr, std::chrono::seconds(5)));
    auto j = ParseUntrustedJson(text);
    if (!j.ok() || !j->is_object() || !j->contains("state") || !(*j)["state"].is_string()) {
      return absl::InternalError(fmt::format("firecracker api: GET / says no state: {}", text.substr(0, 200)));
    }
    return (*j)["state"].get<std::string>() == "Running";
  }

  // A full snapshot: the vmstate and the guest's memory, written by the VMM in its root, then
  // moved beside the VM's record (same file system) as `state` and `state.mem`.
  absl::StatusOr<int64_t> Save(const std::string& state, std::chrono::seconds timeout) const override {
    ::unlink((root_ + kSnapFile).c_str());
    ::unlink((root_ + kMemFile).c_str());
    SBX_RETURN_IF_ERROR(Call("PUT", "/snapshot/create",
                             {{"snapshot_type", "Full"}, {"snapshot_path", kSnapFile}, {"mem_file_path", kMemFile}},
                             timeout));
    int64_t bytes = 0;
    for (const auto& [from, to] : {std::pair{root_ + kSnapFile, state}, std::pair{root_ + kMemFile, state + ".mem"}}) {
      SBX_RETURN_IF_ERROR(Fsync(from));
      if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, fmt::format("rename({}, {})", from, to));
      struct stat st{};
      if (::stat(to.c_str(), &st) == 0) bytes += static_cast<int64_t>(st.st_size);
    }
    return bytes;
  }
  // Firecracker has no quit request for a paused VM: the caller's Stop ends the process.
  void Quit() const override {}

  // The same jailer command without the config: the VM comes from the snapshot. What the
  // jailer and the last VMM made in the root (device nodes, the binary's copy, sockets) goes
  // first, and the snapshot's files are linked in (the originals stay until the wake is done).
  absl::StatusOr<RestoreStart> Restore(const std::vector<std::string>& boot_argv,
                                       const std::string& state) const override {
    RestoreStart r;
    for (size_t i = 0; i < boot_argv.size(); ++i) {
      if (boot_argv[i] == "--config-file" && i + 1 < boot_argv.size()) {
        ++i;
        continue;
      }
      r.argv.push_back(boot_argv[i]);
    }
    // The jailer wants a fresh root: its device nodes (mknod), its copy of the binary and its
    // pid file (<name>.pid, create_new) and the sockets would each fail the next start.
    std::string exec_name = "firecracker";
    for (size_t i = 0; i + 1 < boot_argv.size(); ++i) {
      if (boot_argv[i] == "--exec-file") exec_name = fs::path(boot_argv[i + 1]).filename().string();
    }
    std::error_code ec;
    for (const std::string& leftover : {std::string("/dev"), std::string("/run"), "/" + exec_name,
                                        "/" + exec_name + ".pid", std::string(kApiSock), std::string(kVsockUds)}) {
      fs::remove_all(root_ + leftover, ec);
    }
    SBX_RETURN_IF_ERROR(LinkInto(state, root_ + kSnapFile));
    SBX_RETURN_IF_ERROR(LinkInto(state + ".mem", root_ + kMemFile));
    return r;
  }
  absl::Status AwaitLoaded(const std::string& state, const std::function<absl::Status()>& alive,
                           std::chrono::steady_clock::time_point deadline) const override {
    for (auto pause = std::chrono::milliseconds(2);; pause = std::min(pause * 2, std::chrono::milliseconds(20))) {
      if (FirecrackerRequest(api_, "GET", "/", nullptr, std::chrono::seconds(2)).ok()) break;
      SBX_RETURN_IF_ERROR(Annotate(alive(), "Firecracker starting"));
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(fmt::format("Firecracker's API ({}) did not answer in time", api_));
      }
      std::this_thread::sleep_for(pause);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    SBX_RETURN_IF_ERROR(Annotate(
        Call("PUT", "/snapshot/load",
             {{"snapshot_path", kSnapFile},
              {"mem_backend", {{"backend_type", "File"}, {"backend_path", kMemFile}}},
              {"resume_vm", false}},
             std::max(left, std::chrono::milliseconds(1000))),
        fmt::format("load {}", state)));
    // The VMM maps the memory file: its inode lives on while the VM runs.
    ::unlink((root_ + kSnapFile).c_str());
    ::unlink((root_ + kMemFile).c_str());
    return absl::OkStatus();
  }

  GuestLink Link() const override { return {root_ + kVsockUds, fmt::format("CONNECT {}\n", agent::kGuestVsockPort)}; }

 private:
  absl::Status Call(const std::string& method, const std::string& path, const Json& body,
                    std::chrono::milliseconds timeout = std::chrono::seconds(5)) const {
    return FirecrackerRequest(api_, method, path, body, timeout).status();
  }

  std::string dir_;
  std::string root_;
  std::string api_;
};

}  // namespace

std::unique_ptr<Vmm> NewFirecrackerVmm(const std::string& vm_dir) {
  return std::make_unique<FirecrackerVmm>(vm_dir);
}

}  // namespace sbx::runtime::microvm
