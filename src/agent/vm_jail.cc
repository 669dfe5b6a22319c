#include "agent/vm_jail.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/files.h"
#include "common/status_util.h"

namespace sbx::agent {
namespace {

[[noreturn]] void Die(const std::string& step) {
  std::fprintf(stderr, "sbx-agent --vm-jail: %s: %s\n", step.c_str(), std::strerror(errno));
  std::fflush(stderr);
  _exit(125);
}

[[noreturn]] void DieMsg(const std::string& msg) {
  std::fprintf(stderr, "sbx-agent --vm-jail: %s\n", msg.c_str());
  std::fflush(stderr);
  _exit(125);
}

void MkdirAll(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += "/" + part;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) Die("mkdir " + cur);
  }
}

// The mount point for `src` at root + path: a directory or an empty file, as the source is.
void MakeMountPoint(const std::string& root, const std::string& path, bool dir) {
  const std::string at = root + path;
  if (dir) {
    MkdirAll(at);
    return;
  }
  MkdirAll(at.substr(0, at.rfind('/')));
  const int fd = ::open(at.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) Die("create mount point " + at);
  ::close(fd);
}

void Bind(const std::string& root, const JailBind& b) {
  struct stat st;
  if (::stat(b.path.c_str(), &st) != 0) Die("stat " + b.path);
  MakeMountPoint(root, b.path, S_ISDIR(st.st_mode));
  const std::string at = root + b.path;
  if (::mount(b.path.c_str(), at.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) Die("bind " + b.path);
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID;
  if (!b.writable) flags |= MS_RDONLY;
  if (!b.device) flags |= MS_NODEV;
  if (::mount(nullptr, at.c_str(), nullptr, flags, nullptr) != 0) Die("remount " + b.path);
}

// The files it writes: bounded, and a write past the bound fails instead of killing the VMM.
void BoundFiles(const JailSpec& spec) {
  if (spec.max_file_bytes == 0) return;
  const rlimit lim{spec.max_file_bytes, spec.max_file_bytes};
  if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) Die("setrlimit(RLIMIT_FSIZE)");
  if (::signal(SIGXFSZ, SIG_IGN) == SIG_ERR) Die("ignore SIGXFSZ");
}

[[noreturn]] void Exec(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  char* envp[] = {const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
  ::execve(args[0], args.data(), envp);
  Die("execve " + argv[0]);
}

}  // namespace

int RunVmJail(const std::string& spec_path, const std::vector<std::string>& argv) {
  if (argv.empty()) DieMsg("no program to run");
  const nlohmann::json j = nlohmann::json::parse(ReadFileOrEmpty(spec_path), nullptr, false);
  JailSpec spec;
  std::string error;
  if (j.is_discarded() || !JailSpec::FromJson(j, &spec, &error)) DieMsg(spec_path + ": " + error);

  // 1. Cgroups, while this process may still write there.
  for (const auto& procs : spec.cgroup_procs) {
    const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "0", 1) != 1) Die("join " + procs);
    ::close(fd);
  }
  // The program jails itself (Firecracker's jailer): it runs as root, its files bounded.
  if (spec.delegate) {
    BoundFiles(spec);
    Exec(argv);
  }
  // 2. The tap: opening a tap by name needs CAP_NET_ADMIN and the host's network namespace.
  if (!spec.tap.empty()) {
    // inheritable: the VMM execed below finds its tap at fd 4.
    const int fd = ::open("/dev/net/tun", O_RDWR);
    if (fd < 0) Die("open /dev/net/tun");
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, spec.tap.c_str(), IFNAMSIZ - 1);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if (::ioctl(fd, TUNSETIFF, &ifr) != 0) Die("TUNSETIFF " + spec.tap);
    if (fd != 4) {
      if (::dup2(fd, 4) < 0) Die("dup2 tap");
      ::close(fd);
    }
  }
  // 3. Namespaces.
  if (::unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0) Die("unshare");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) Die("make / private");
  // 4. The root.
  if (::mount("tmpfs", spec.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") != 0) {
    Die("mount tmpfs on " + spec.root);
  }
  for (const char* link : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    char target[256];
    const ssize_t n = ::readlink(link, target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (::symlink(target, (spec.root + link).c_str()) != 0) Die(std::string("symlink ") + link);
  }
  for (const auto& b : spec.binds) Bind(spec.root, b);
  const std::string old = spec.root + "/.old";
  if (::mkdir(old.c_str(), 0700) != 0) Die("mkdir .old");
  if (::syscall(SYS_pivot_root, spec.root.c_str(), old.c_str()) != 0) Die("pivot_root");
  if (::chdir("/") != 0) Die("chdir /");
  if (::umount2("/.old", MNT_DETACH) != 0) Die("detach the old root");
  if (::rmdir("/.old") != 0) Die("rmdir /.old");
  if (::mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
    // A tmpfs root remounts read-only by its own flags, not as a bind.
    if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
      Die("remount / read-only");
    }
  }
  BoundFiles(spec);
  // 5. Credentials.
  std::vector<gid_t> groups(spec.groups.begin(), spec.groups.end());
  if (::setgroups(groups.size(), groups.data()) != 0) Die("setgroups");
  if (::setresgid(spec.gid, spec.gid, spec.gid) != 0) Die("setresgid");
  if (::setresuid(spec.uid, spec.uid, spec.uid) != 0) Die("setresuid");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) Die("prctl(PR_SET_NO_NEW_PRIVS)");
  // 6. QEMU.
  Exec(argv);
}

absl::Status ConfineBridge(uint32_t uid, const std::string& empty_dir, const std::string& jail_spec) {
  auto fail = [](const char* step) { return ErrnoStatus(errno, std::string("confine the bridge: ") + step); };
  if (uid == 0) return absl::InvalidArgumentError("confine the bridge: uid 0 is no confinement");
  // The VM's cgroups: what the bridge uses counts against the VM's memory and task limits.
  if (absl::StatusOr<std::string> text = ReadFileToString(jail_spec); text.ok()) {
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
    JailSpec spec;
    std::string error;
    if (j.is_discarded() || !JailSpec::FromJson(j, &spec, &error)) {
      return absl::InvalidArgumentError("confine the bridge: " + jail_spec + ": " + error);
    }
    for (const auto& procs : spec.cgroup_procs) {
      const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
      const bool joined = fd >= 0 && ::write(fd, "0", 1) == 1;
      const int err = errno;
      if (fd >= 0) ::close(fd);
      if (!joined) return ErrnoStatus(err, "confine the bridge: join " + procs);
    }
  }
  if (::unshare(CLONE_NEWNET | CLONE_NEWIPC) != 0) return fail("unshare(CLONE_NEWNET|CLONE_NEWIPC)");
  if (::mkdir(empty_dir.c_str(), 0555) != 0 && errno != EEXIST) return fail("mkdir the empty root");
  struct stat st {};
  // Made by this root-run process in sbxd's own VM directory; anything else there is refused.
  if (::lstat(empty_dir.c_str(), &st) != 0) return fail("lstat the empty root");
  if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 0222) != 0) {
    errno = EPERM;
    return fail("the empty root is not a read-only directory of root's");
  }
  if (::chroot(empty_dir.c_str()) != 0) return fail("chroot");
  if (::chdir("/") != 0) return fail("chdir /");
  const rlimit fsize{16u << 20, 16u << 20};
  ::signal(SIGXFSZ, SIG_IGN);
  if (::setrlimit(RLIMIT_FSIZE, &fsize) != 0) return fail("setrlimit(RLIMIT_FSIZE)");
  if (::setgroups(0, nullptr) != 0) return fail("setgroups(0)");
  if (::setresgid(uid, uid, uid) != 0) return fail("setresgid");
  if (::setresuid(uid, uid, uid) != 0) return fail("setresuid");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("prctl(PR_SET_NO_NEW_PRIVS)");
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return fail("prctl(PR_SET_DUMPABLE, 0)");
  return absl::OkStatus();
}

}  // namespace sbx::agent
