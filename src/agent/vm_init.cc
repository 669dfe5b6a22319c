#include "agent/vm_init.h"

#include <dirent.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <linux/ipv6.h>
#include <net/if.h>
#include <net/route.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <linux/vm_sockets.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/vm_jail.h"
#include "common/files.h"
#include "protocol/mux.h"

extern char** environ;

namespace sbx::agent {
namespace {

using Json = nlohmann::json;

// Everything init says goes to the console (the VM's serial console, kept by the host in
// console.log), where the host reads the reason a boot failed.
void Say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fputs("sbx-init: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

[[noreturn]] void Fail(const char* step) {
  Say("%s: %s; powering off", step, std::strerror(errno));
  ::sync();
  ::reboot(RB_POWER_OFF);
  _exit(1);
}

[[noreturn]] void FailMsg(const std::string& msg) {
  Say("%s; powering off", msg.c_str());
  ::reboot(RB_POWER_OFF);
  _exit(1);
}

void MkdirP(const std::string& path, mode_t mode = 0755) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += "/" + part;
    ::mkdir(cur.c_str(), mode);
  }
}

void Mount(const char* src, const std::string& dst, const char* type, unsigned long flags,
           const std::string& data) {
  if (::mount(src, dst.c_str(), type, flags, data.empty() ? nullptr : data.c_str()) != 0) {
    const int e = errno;
    FailMsg(std::string("mount ") + type + " " + src + " on " + dst + " (" + data +
            "): " + std::strerror(e));
  }
}

std::string ReadFile(const std::string& path) { return ReadFileOrEmpty(path); }

// virtio_mmio is a module in Debian's kernel, so the devices QEMU lists on the command line
// (virtio_mmio.device=...) reach it only when init passes them, as modprobe would.
std::string ModuleParams(const std::string& module) {
  std::string name = module.substr(module.rfind('/') + 1);
  name = name.substr(0, name.find('.'));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  std::string cmdline = ReadFile("/proc/cmdline");
  std::stringstream ss(cmdline);
  std::string word, out;
  while (ss >> word) {
    if (word.rfind(name + ".", 0) == 0) {
      if (!out.empty()) out += ' ';
      out += word.substr(name.size() + 1);
    }
  }
  return out;
}

void LoadModules() {
  std::stringstream list(ReadFile("/lib/modules/load.list"));
  std::string path;
  while (std::getline(list, path)) {
    if (path.empty()) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Fail(("open " + path).c_str());
    const std::string params = ModuleParams(path);
    if (::syscall(SYS_finit_module, fd, params.c_str(), 0) != 0 && errno != EEXIST) {
      Fail(("finit_module " + path).c_str());
    }
    ::close(fd);
  }
}

// The device node of the virtio-serial port named `name`, once the kernel made it.
std::string FindPort(const std::string& name) {
  DIR* d = ::opendir("/sys/class/virtio-ports");
  if (d == nullptr) return {};
  std::string found;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string n = ReadFile(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
    while (!n.empty() && (n.back() == '\n' || n.back() == '\0')) n.pop_back();
    if (n == name) {
      found = std::string("/dev/") + e->d_name;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// Devices appear as their drivers probe them, after finit_module returned.
std::string WaitFor(const std::function<std::string()>& probe, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::string p = probe();
    if (!p.empty() && ::access(p.c_str(), F_OK) == 0) return p;
    if (std::chrono::steady_clock::now() > deadline) {
      FailMsg(std::string("no ") + what + " after 30 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Under Firecracker (kernel parameter sbx.disks=order) disks have no serial; they come in the
// order the runtime gave them: config, the sandbox's disk, then the trees sbxl0, sbxl1, ...
std::string DiskByOrder(const std::string& serial) {
  int index = -1;
  if (serial == kGuestConfigSerial) {
    index = 0;
  } else if (serial == kGuestDiskSerial) {
    index = 1;
  } else if (serial.rfind("sbxl", 0) == 0 && serial.size() > 4 && serial.size() < 7) {
    index = 2 + std::atoi(serial.c_str() + 4);
  }
  if (index < 0 || index >= 26) return {};
  return std::string("/dev/vd") + static_cast<char>('a' + index);
}

bool DisksByOrder() {
  std::stringstream ss(ReadFile("/proc/cmdline"));
  std::string word;
  while (ss >> word) {
    if (word == "sbx.disks=order") return true;
  }
  return false;
}

// The virtio disk QEMU was given with `serial=<serial>`: the order of virtio-mmio devices is
// the kernel's, so disks are known by the serial the host gave them, not by vda, vdb, ...
std::string FindDisk(const std::string& serial) {
  static const bool by_order = DisksByOrder();
  if (by_order) return DiskByOrder(serial);
  DIR* d = ::opendir("/sys/block");
  if (d == nullptr) return {};
  std::string found;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "vd", 2) != 0) continue;
    std::string s = ReadFile(std::string("/sys/block/") + e->d_name + "/serial");
    while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
    if (s == serial) {
      found = std::string("/dev/") + e->d_name;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// The config disk holds the JSON, then zeros up to its size (a whole number of sectors).
std::string ReadConfigDisk(const std::string& dev) {
  std::string text = ReadFile(dev);
  const size_t end = text.find('\0');
  if (end != std::string::npos) text.resize(end);
  return text;
}

constexpr const char* k9p = "trans=virtio,version=9p2000.L,msize=512000";

void WriteSmall(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

void IfUp(int sock, const std::string& name) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name.c_str(), IFNAMSIZ - 1);
  if (::ioctl(sock, SIOCGIFFLAGS, &ifr) != 0) Fail(("SIOCGIFFLAGS " + name).c_str());
  ifr.ifr_flags |= IFF_UP;
  if (::ioctl(sock, SIOCSIFFLAGS, &ifr) != 0) Fail(("SIOCSIFFLAGS " + name).c_str());
}

// "10.0.0.2/30" -> the address's bytes and the prefix length.
template <typename Addr>
int ParseCidr(const std::string& cidr, int family, Addr* out) {
  const size_t slash = cidr.find('/');
  const std::string a = cidr.substr(0, slash);
  if (::inet_pton(family, a.c_str(), out) != 1) FailMsg("network: bad address " + cidr);
  return slash == std::string::npos ? (family == AF_INET ? 32 : 128) : std::atoi(cidr.c_str() + slash + 1);
}

// The sandbox's NIC (virtio-net on the host's tap), as the ns runtime's eth0: the sandbox end's
// addresses, default routes via the host end, with ioctls (no netlink library in the guest).
// Duplicate address detection is off: the /126 holds only the host end and us.
void SetUpNic(const Json& net) {
  const std::string nic = WaitFor(
      [] {
        DIR* d = ::opendir("/sys/class/net");
        std::string found;
        while (d != nullptr && found.empty()) {
          dirent* e = ::readdir(d);
          if (e == nullptr) break;
          if (e->d_name[0] != '.' && std::strcmp(e->d_name, "lo") != 0) found = e->d_name;
        }
        if (d != nullptr) ::closedir(d);
        return found.empty() ? found : "/sys/class/net/" + found;
      },
      "network interface");
  const std::string name = nic.substr(nic.rfind('/') + 1);
  const int s4 = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const int s6 = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s4 < 0 || s6 < 0) Fail("network: socket");
  WriteSmall("/proc/sys/net/ipv6/conf/" + name + "/accept_dad", "0");
  WriteSmall("/proc/sys/net/ipv6/conf/" + name + "/accept_ra", "0");
  WriteSmall("/proc/sys/net/ipv6/conf/" + name + "/autoconf", "0");

  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name.c_str(), IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  const int len4 = ParseCidr(net.at("ipv4").get<std::string>(), AF_INET, &sin->sin_addr);
  if (::ioctl(s4, SIOCSIFADDR, &ifr) != 0) Fail("network: SIOCSIFADDR");
  sin->sin_addr.s_addr = len4 == 0 ? 0 : htonl(~uint32_t{0} << (32 - len4));
  if (::ioctl(s4, SIOCSIFNETMASK, &ifr) != 0) Fail("network: SIOCSIFNETMASK");
  IfUp(s4, name);
  if (::ioctl(s4, SIOCGIFINDEX, &ifr) != 0) Fail("network: SIOCGIFINDEX");
  const int ifindex = ifr.ifr_ifindex;

  in6_ifreq r6{};
  r6.ifr6_prefixlen = static_cast<uint32_t>(ParseCidr(net.at("ipv6").get<std::string>(), AF_INET6, &r6.ifr6_addr));
  r6.ifr6_ifindex = ifindex;
  if (::ioctl(s6, SIOCSIFADDR, &r6) != 0) Fail("network: SIOCSIFADDR (IPv6)");

  rtentry rt{};
  auto* gw = reinterpret_cast<sockaddr_in*>(&rt.rt_gateway);
  gw->sin_family = AF_INET;
  ParseCidr(net.at("gw4").get<std::string>(), AF_INET, &gw->sin_addr);
  reinterpret_cast<sockaddr_in*>(&rt.rt_dst)->sin_family = AF_INET;
  reinterpret_cast<sockaddr_in*>(&rt.rt_genmask)->sin_family = AF_INET;
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (::ioctl(s4, SIOCADDRT, &rt) != 0) Fail("network: SIOCADDRT (default route)");
  in6_rtmsg rt6{};
  ParseCidr(net.at("gw6").get<std::string>(), AF_INET6, &rt6.rtmsg_gateway);
  rt6.rtmsg_flags = RTF_UP | RTF_GATEWAY;
  rt6.rtmsg_metric = 1;
  rt6.rtmsg_ifindex = ifindex;
  if (::ioctl(s6, SIOCADDRT, &rt6) != 0) Fail("network: SIOCADDRT (IPv6 default route)");
  ::close(s4);
  ::close(s6);
}

// sbxd's resolver for this sandbox, over the template's /etc/resolv.conf (or the file a link
// there names), as the ns runtime binds it; the file itself lives in root's /run/sbx.
void BindResolvConf(const Json& net) {
  const std::string text = net.value("resolv_conf", std::string());
  std::string target = "/newroot" + net.value("resolv_path", std::string("/etc/resolv.conf"));
  const std::string src = "/newroot/run/sbx/resolv.conf";
  if (absl::Status st = WriteFileContents(src, text); !st.ok()) FailMsg(std::string(st.message()));
  ::chmod(src.c_str(), 0644);
  if (::access(target.c_str(), F_OK) != 0) {
    MkdirP(target.substr(0, target.rfind('/')));
    const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
  }
  if (::mount(src.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
      ::mount(nullptr, target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
    Say("resolv.conf: bind over %s: %s (the sandbox keeps the template's)", target.c_str(), std::strerror(errno));
  }
}

}  // namespace

static int VmInit() {
  ::umask(022);
  MkdirP("/dev");
  MkdirP("/proc");
  MkdirP("/sys");
  if (::mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755") != 0 && errno != EBUSY) {
    Fail("mount /dev");
  }
  // The kernel opened /dev/console for us before /dev existed, or not at all.
  if (int c = ::open("/dev/console", O_RDWR | O_CLOEXEC); c >= 0) {
    ::dup2(c, 0);
    ::dup2(c, 1);
    ::dup2(c, 2);
    ::close(c);
  }
  Mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  Mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  LoadModules();


  // Config and template trees on disks, not 9p shares where it can: QEMU refuses to migrate a
  // VM that has a 9p share mounted, and suspend is a migration to a file.
  const std::string cfg_dev = WaitFor([] { return FindDisk(kGuestConfigSerial); }, "config disk");
  Json cfg;
  const std::string cfg_text = ReadConfigDisk(cfg_dev);
  try {
    cfg = Json::parse(cfg_text);
  } catch (const std::exception& e) {
    FailMsg(std::string("config.json: ") + e.what() + ": " + cfg_text.substr(0, 200));
  }

  // The root: the template's trees (top first) under the sandbox's own disk.
  std::string lowers;
  int n = 0;
  for (const auto& l : cfg.at("lowers")) {
    const std::string dir = "/lower/" + std::to_string(n++);
    MkdirP(dir);
    if (l.contains("disk")) {
      const std::string serial = l.at("disk").get<std::string>();
      const std::string dev = WaitFor([&] { return FindDisk(serial); }, ("disk " + serial).c_str());
      Mount(dev.c_str(), dir, "ext4", MS_RDONLY | MS_NOSUID | MS_NODEV, "noload");
    } else {
      Mount(l.at("share").get<std::string>().c_str(), dir, "9p", MS_RDONLY | MS_NOSUID | MS_NODEV, k9p);
    }
    lowers += (lowers.empty() ? "" : ":") + dir;
  }
  const std::string disk = WaitFor([] { return FindDisk(kGuestDiskSerial); }, "the sandbox's disk");
  MkdirP("/disk");
  Mount(disk.c_str(), "/disk", "ext4", MS_NOSUID | MS_NODEV, "");
  MkdirP("/newroot");
  Mount("overlay", "/newroot", "overlay", 0,
        "lowerdir=" + lowers + ",upperdir=/disk/upper,workdir=/disk/work");
  for (const auto& b : cfg.at("binds")) {
    const std::string dst = "/newroot" + b.at("path").get<std::string>();
    MkdirP(dst);
    unsigned long flags = MS_NOSUID | MS_NODEV;
    if (b.value("read_only", true)) flags |= MS_RDONLY;
    Mount(b.at("tag").get<std::string>().c_str(), dst, "9p", flags, k9p);
  }
  MkdirP("/newroot/proc");
  MkdirP("/newroot/sys");
  MkdirP("/newroot/dev");
  MkdirP("/newroot/tmp", 01777);
  MkdirP("/newroot/run");
  Mount("proc", "/newroot/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  Mount("sysfs", "/newroot/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "");
  Mount("devtmpfs", "/newroot/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  MkdirP("/newroot/dev/pts");
  MkdirP("/newroot/dev/shm", 01777);
  Mount("devpts", "/newroot/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620");
  // /tmp and /dev/shm as on the ns runtime: tmpfs of the sandbox's tmp_mib and shm_mib.
  Mount("tmpfs", "/newroot/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
        "mode=1777,size=" + std::to_string(cfg.value("shm_mib", int64_t{64})) + "m");
  Mount("tmpfs", "/newroot/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
        "mode=1777,size=" + std::to_string(cfg.value("tmp_mib", int64_t{256})) + "m");
  // The agent's socket: root's alone. Whoever reaches it runs anything as anyone, and a
  // template's code may run as an ordinary user.
  MkdirP("/newroot/run/sbx", 0700);
  Mount("tmpfs", "/newroot/run/sbx", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700");

  {
    // The kernel leaves lo down; servers on 127.0.0.1 (and the port exposure into them) need it.
    const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) Fail("socket");
    IfUp(s, "lo");
    ::close(s);
  }
  if (cfg.contains("net") && cfg["net"].is_object()) {
    SetUpNic(cfg["net"]);
    BindResolvConf(cfg["net"]);
  }

  const std::string hostname = cfg.value("hostname", std::string("sandbox"));
  ::sethostname(hostname.data(), hostname.size());

  // The host's way in: QEMU's virtio-serial port, or (Firecracker) a vsock port it connects to.
  const bool vsock = cfg.value("agent_link", std::string("virtio-serial")) == "vsock";
  int port_fd = -1;
  if (vsock) {
    port_fd = ::socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_vm addr{};
    addr.svm_family = AF_VSOCK;
    addr.svm_cid = VMADDR_CID_ANY;
    addr.svm_port = kGuestVsockPort;
    if (port_fd < 0 || ::bind(port_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(port_fd, 4) != 0) {
      Fail("listen on vsock");
    }
  } else {
    const std::string port = WaitFor([] { return FindPort(kGuestPortName); }, "virtio-serial port sbx.agent");
    port_fd = ::open(port.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (port_fd < 0) Fail(("open " + port).c_str());
  }
  const int self = ::open("/init", O_RDONLY | O_CLOEXEC);
  if (self < 0) Fail("open /init");
  // A build step's upper, opened before the move hides /disk: the agent streams it as the
  // step's layer (export_layer.cc). Inherited by the agent, which marks it close-on-exec.
  int upper = -1;
  if (cfg.value("keep_writable_layer", false)) {
    upper = ::open("/disk/upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW);  // inheritable: see above
    if (upper < 0) Fail("open /disk/upper");
  }

  if (::chdir("/newroot") != 0) Fail("chdir /newroot");
  if (::mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) Fail("move the root");
  if (::chroot(".") != 0) Fail("chroot");
  if (::chdir("/") != 0) Fail("chdir /");

  const pid_t pump = ::fork();
  if (pump < 0) Fail("fork the mux pump");
  if (pump == 0) {
    protocol::MuxPumpOptions o;
    o.connect_path = kGuestAgentSocket;
    if (!vsock) {
      o.port_fd = port_fd;
      o.port_reconnects = true;
      const absl::Status st = protocol::RunMuxPump(o);
      Say("mux pump ended: %s", std::string(st.message()).c_str());
      _exit(1);
    }
    // One host bridge at a time; a new one (after a wake: Firecracker resets vsock connections
    // on a snapshot load) starts with no streams, as a hello does on the serial port.
    for (;;) {
      const int conn = ::accept4(port_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) {
        if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      o.port_fd = conn;
      if (const absl::Status st = protocol::RunMuxPump(o); !st.ok()) {
        Say("mux pump: %s", std::string(st.message()).c_str());
      }
      ::close(conn);
    }
  }
  ::close(port_fd);

  std::vector<std::string> env;
  const Json env_cfg = cfg.value("env", Json::object());
  for (const auto& [k, v] : env_cfg.items()) {
    env.push_back(k + "=" + v.get<std::string>());
  }
  std::vector<std::string> args = {"sbx-agent",   "--listen",     kGuestAgentSocket,
                                   "--sandbox-id", cfg.value("id", std::string()),
                                   "--root",      "/",
                                   "--workdir",   cfg.value("workdir", std::string("/"))};
  if (const int64_t b = cfg.value("buffer_bytes", int64_t{0}); b > 0) {
    args.push_back("--buffer-bytes");
    args.push_back(std::to_string(b));
  }
  if (upper >= 0) {
    args.insert(args.end(), {"--upper-fd", std::to_string(upper), "--spare-pid", std::to_string(pump)});
  }
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  ::fexecve(self, argv.data(), envp.data());
  Fail("exec the agent");
}

int RunVmInit() {
  try {
    return VmInit();
  } catch (const std::exception& e) {
    FailMsg(std::string("init: ") + e.what());
  }
}

namespace {

// Firecracker's vsock: the host side connects to its unix socket and asks for the guest's port
// with a line; "OK <n>" means the guest accepted. Until the guest listens, the VMM closes it.
bool VsockHandshake(int fd, const std::string& line) {
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return false;
  std::string answer;
  char c = 0;
  pollfd p{fd, POLLIN, 0};
  while (answer.size() < 64) {
    if (::poll(&p, 1, 2000) != 1 || ::read(fd, &c, 1) != 1) return false;
    if (c == '\n') break;
    answer += c;
  }
  return answer.rfind("OK ", 0) == 0;
}

}  // namespace

int RunVmBridge(const std::string& port_path, const std::string& listen_path, const std::string& connect_line,
                uint32_t as_uid) {
  auto addr_of = [](const std::string& p, sockaddr_un* a) {
    *a = {};
    a->sun_family = AF_UNIX;
    if (p.size() >= sizeof(a->sun_path)) return false;
    std::memcpy(a->sun_path, p.data(), p.size());
    return true;
  };
  sockaddr_un la{}, pa{};
  if (!addr_of(listen_path, &la) || !addr_of(port_path, &pa)) {
    std::fprintf(stderr, "sbx-agent --vm-bridge: socket path too long\n");
    return 2;
  }
  auto listen_on = [&](const std::string& path, const sockaddr_un& a) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ::unlink(path.c_str());
    if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 128) != 0) {
      std::fprintf(stderr, "sbx-agent --vm-bridge: listen on %s: %s\n", path.c_str(), std::strerror(errno));
      return -1;
    }
    return fd;
  };
  const int lfd = listen_on(listen_path, la);
  if (lfd < 0) return 1;
  // Beside it, ports.sock: a client names a port (protocol/mux.h, kOpen's port target) and
  // talks to that port in the guest, which needs no NIC for it.
  const std::string ports_path = listen_path.substr(0, listen_path.rfind('/') + 1) + kBridgePortsSocket;
  sockaddr_un pta{};
  if (!addr_of(ports_path, &pta)) {
    std::fprintf(stderr, "sbx-agent --vm-bridge: socket path too long\n");
    return 2;
  }
  const int ports_fd = listen_on(ports_path, pta);
  if (ports_fd < 0) return 1;
  // QEMU makes its end when it starts, which may be just after us; a guest behind vsock
  // accepts once its init listens, after its kernel booted.
  int pfd = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(connect_line.empty() ? 30 : 300);
  for (;;) {
    pfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int e = 0;
    if (::connect(pfd, reinterpret_cast<sockaddr*>(&pa), sizeof(pa)) == 0) {
      if (connect_line.empty() || VsockHandshake(pfd, connect_line)) break;
      e = ECONNREFUSED;
    } else {
      e = errno;
    }
    ::close(pfd);
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "sbx-agent --vm-bridge: connect to %s: %s\n", port_path.c_str(),
                   std::strerror(e));
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (as_uid != 0) {
    const std::string dir = listen_path.substr(0, listen_path.rfind('/') + 1);
    if (const absl::Status st = ConfineBridge(as_uid, dir + "bridge-root", dir + "jail.json"); !st.ok()) {
      std::fprintf(stderr, "sbx-agent --vm-bridge: %s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  protocol::MuxPumpOptions o;
  o.port_fd = pfd;
  o.listen_fd = lfd;
  o.port_listen_fd = ports_fd;
  const absl::Status st = protocol::RunMuxPump(o);
  ::unlink(listen_path.c_str());
  ::unlink(ports_path.c_str());
  std::fprintf(stderr, "sbx-agent --vm-bridge: the VM's port %s closed\n", port_path.c_str());
  if (!st.ok()) {
    std::fprintf(stderr, "sbx-agent --vm-bridge: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace sbx::agent
