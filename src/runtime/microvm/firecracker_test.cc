// The Firecracker driver's pure parts and its API client. Firecracker itself needs KVM that runs
// stock guests, which these machines lack (research/feasibility.md rows 8a-8d): the e2e case
// (tests/e2e/test_microvm_firecracker.py) runs where SBX_FIRECRACKER names its binaries and is
// reported as not run elsewhere.
#include "runtime/microvm/firecracker.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "protocol/jail_spec.h"
#include "runtime/microvm/vmm.h"

namespace sbx::runtime::microvm {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A directory of its own under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/sbx-fc-test-XXXXXX";
    if (::mkdtemp(t) != nullptr) path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

FirecrackerVm SampleVm(const std::string& dir) {
  FirecrackerVm vm;
  vm.firecracker = "/opt/fc/firecracker-v1.16.1-x86_64";
  vm.jailer = "/opt/fc/jailer-v1.16.1-x86_64";
  vm.vm_dir = dir;
  vm.sandbox_id = "sbx_abc123";
  vm.uid = 524288;
  vm.vcpus = 2;
  vm.memory_mib = 256;
  vm.vmlinux = dir + "/vmlinux";
  vm.initramfs = dir + "/initramfs";
  vm.cmdline = "extra=1";
  vm.drives = {{dir + "/guest.cfg", true}, {dir + "/disk.img", false}, {dir + "/tree.img", true}};
  vm.max_file_bytes = 1 << 30;
  return vm;
}

std::set<std::string> Keys(const Json& j) {
  std::set<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out.insert(it.key());
  return out;
}

TEST(Firecracker, ConfigUsesOnlyFieldsOfItsApiAndKeepsTheDriveOrder) {
  const Json cfg = FirecrackerConfig(SampleVm("/s/vm/sbx_abc123"));
  // Firecracker answers 400 to a field it does not know: exactly these.
  EXPECT_EQ(Keys(cfg), (std::set<std::string>{"boot-source", "drives", "machine-config", "vsock"}));
  EXPECT_EQ(Keys(cfg["boot-source"]), (std::set<std::string>{"kernel_image_path", "initrd_path", "boot_args"}));
  const std::string args = cfg["boot-source"]["boot_args"];
  // Its default command line turns the serial console off: ours has it, and the guest finds
  // its disks by order.
  EXPECT_NE(args.find("console=ttyS0"), std::string::npos) << args;
  EXPECT_NE(args.find("sbx.disks=order"), std::string::npos) << args;
  EXPECT_NE(args.find("extra=1"), std::string::npos) << args;
  EXPECT_EQ(args.find("nomodule"), std::string::npos) << args;  // the initramfs loads modules
  ASSERT_EQ(cfg["drives"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Json& d = cfg["drives"][i];
    EXPECT_EQ(Keys(d), (std::set<std::string>{"drive_id", "path_on_host", "is_root_device", "is_read_only"}));
    EXPECT_EQ(d["path_on_host"], "/drive" + std::to_string(i));
    EXPECT_EQ(d["is_root_device"], false);  // a root drive would be moved first (vda)
    // Drive ids: letters, digits and '_' only.
    for (char c : d["drive_id"].get<std::string>()) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  }
  EXPECT_EQ(cfg["drives"][1]["is_read_only"], false);
  EXPECT_EQ(cfg["machine-config"], (Json{{"vcpu_count", 2}, {"mem_size_mib", 256}, {"smt", false}}));
  EXPECT_EQ(cfg["vsock"], (Json{{"guest_cid", kGuestVsockCid}, {"uds_path", "/v.sock"}}));

  FirecrackerVm net = SampleVm("/s/vm/sbx_abc123");
  net.tap = "sbxtap0";
  net.mac = "02:73:62:00:00:01";
  const Json with_nic = FirecrackerConfig(net);
  ASSERT_EQ(with_nic["network-interfaces"].size(), 1u);
  EXPECT_EQ(with_nic["network-interfaces"][0],
            (Json{{"iface_id", "eth0"}, {"host_dev_name", "sbxtap0"}, {"guest_mac", "02:73:62:00:00:01"}}));
}

TEST(Firecracker, JailerArgvNamesTheVmByAValidIdAndForwardsTheVmmsFlags) {
  const FirecrackerVm vm = SampleVm("/s/vm/sbx_abc123");
  EXPECT_EQ(JailerId("sbx_abc123"), "sbx-abc123");
  EXPECT_EQ(FirecrackerRoot("/s/vm/sbx_abc123"), "/s/vm/sbx_abc123/fc/firecracker/sbx-abc123/root");
  const std::vector<std::string> boot = JailerArgv(vm, true);
  const std::vector<std::string> want = {
      vm.jailer, "--id", "sbx-abc123", "--exec-file", vm.firecracker, "--uid", "524288", "--gid", "524288",
      "--chroot-base-dir", "/s/vm/sbx_abc123/fc", "--resource-limit", "fsize=1073741824",
      "--", "--api-sock", "/api.sock", "--config-file", "/vm-config.json"};
  EXPECT_EQ(boot, want);
  std::vector<std::string> wake = JailerArgv(vm, false);
  EXPECT_EQ(wake, std::vector<std::string>(want.begin(), want.end() - 2));
}

TEST(Firecracker, PrepareLinksTheFilesIntoTheRootAndRestoreCleansWhatTheJailerLeft) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/sbx_abc123";
  fs::create_directories(dir);
  FirecrackerVm vm = SampleVm(dir);
  vm.uid = ::getuid();
  for (const std::string& f : {vm.vmlinux, vm.initramfs, vm.drives[0].host_path, vm.drives[1].host_path,
                               vm.drives[2].host_path}) {
    std::ofstream(f) << f;
  }
  auto argv = PrepareFirecracker(vm);
  ASSERT_TRUE(argv.ok()) << argv.status();
  const std::string root = FirecrackerRoot(dir);
  for (const char* f : {"/vmlinux", "/initramfs", "/drive0", "/drive1", "/drive2", "/vm-config.json"}) {
    EXPECT_TRUE(fs::exists(root + f)) << f;
  }
  EXPECT_EQ(fs::hard_link_count(root + "/drive1"), 2u);  // the sandbox's disk itself, not a copy
  EXPECT_EQ(Json::parse(std::ifstream(root + "/vm-config.json")), FirecrackerConfig(vm));

  // What a jailer and a VMM leave in the root, and a suspend's files beside vm.json.
  for (const char* d : {"/dev/net", "/run"}) fs::create_directories(root + d);
  for (const char* f : {"/firecracker-v1.16.1-x86_64", "/firecracker-v1.16.1-x86_64.pid", "/api.sock",
                               "/v.sock"}) {
    std::ofstream(root + f) << "x";
  }
  std::ofstream(dir + "/state") << "vmstate";
  std::ofstream(dir + "/state.mem") << "memory";
  auto vmm = OpenVmm("firecracker", dir);
  ASSERT_TRUE(vmm.ok()) << vmm.status();
  auto start = (*vmm)->Restore(*argv, dir + "/state");
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(start->argv, JailerArgv(vm, false));
  EXPECT_FALSE(start->fd3.valid());
  for (const char* f : {"/dev", "/run", "/firecracker-v1.16.1-x86_64", "/firecracker-v1.16.1-x86_64.pid",
                               "/api.sock", "/v.sock"}) {
    EXPECT_FALSE(fs::exists(root + f)) << f;
  }
  EXPECT_EQ(fs::hard_link_count(root + "/state.snap"), 2u);
  EXPECT_EQ(fs::hard_link_count(root + "/state.mem"), 2u);
  const GuestLink link = (*vmm)->Link();
  EXPECT_EQ(link.socket, root + "/v.sock");
  EXPECT_EQ(link.connect_line, "CONNECT 1024\n");
}

TEST(Firecracker, ApiRequestsCarryTheirBodyAndFaultsComeBackInFirecrackersWords) {
  TempDir tmp;
  const std::string sock = tmp.path() + "/api.sock";
  const int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, sock.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(l, 1), 0);
  std::string request;
  std::thread server([&] {
    const int c = ::accept(l, nullptr, nullptr);
    char buf[4096];
    while (request.find("}") == std::string::npos) {
      const ssize_t n = ::read(c, buf, sizeof(buf));
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    const std::string body = R"({"fault_message":"The requested operation is not supported in the current state"})";
    const std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
    (void)!::write(c, reply.data(), reply.size());
    ::close(c);
  });
  auto r = FirecrackerRequest(sock, "PATCH", "/vm", Json{{"state", "Paused"}}, std::chrono::seconds(5));
  server.join();
  ::close(l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("HTTP 400"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("not supported in the current state"), std::string::npos) << r.status();
  EXPECT_EQ(request.rfind("PATCH /vm HTTP/1.1\r\n", 0), 0u) << request;
  EXPECT_NE(request.find(R"({"state":"Paused"})"), std::string::npos) << request;

  auto gone = FirecrackerRequest(tmp.path() + "/none.sock", "GET", "/", nullptr, std::chrono::seconds(2));
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(gone.status().message().find("none.sock"), std::string::npos) << gone.status();
}

TEST(Firecracker, AnAnswerPastItsBoundIsAnErrorNotHeld) {
  TempDir tmp;
  const std::string sock = tmp.path() + "/api.sock";
  const int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, sock.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(l, 1), 0);
  std::thread server([&] {
    const int c = ::accept(l, nullptr, nullptr);
    char buf[4096];
    (void)!::read(c, buf, sizeof(buf));
    const std::string body(1 << 20, 'x');  // a VMM that answers without end
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::close(c);
  });
  auto r = FirecrackerRequest(sock, "GET", "/", nullptr, std::chrono::seconds(5));
  server.join();
  ::close(l);
  EXPECT_FALSE(r.ok());
}

TEST(Firecracker, TheJailDelegatesOnlyWhenAskedAndOtherwiseRefusesRoot) {
  protocol::JailSpec delegate;
  delegate.delegate = true;
  delegate.cgroup_procs = {"/sys/fs/cgroup/sbx-vm/sbx_x/cgroup.procs"};
  protocol::JailSpec parsed;
  std::string error;
  ASSERT_TRUE(protocol::JailSpec::FromJson(delegate.ToJson(), &parsed, &error)) << error;
  EXPECT_TRUE(parsed.delegate);
  protocol::JailSpec root_qemu;  // uid 0 without delegate: refused
  EXPECT_FALSE(protocol::JailSpec::FromJson(root_qemu.ToJson(), &parsed, &error));
  EXPECT_NE(error.find("root"), std::string::npos) << error;
  EXPECT_FALSE(OpenVmm("cloud-hypervisor", "/s/vm/sbx_x").ok());
}

}  // namespace
}  // namespace sbx::runtime::microvm
