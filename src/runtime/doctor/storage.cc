// storage.state_dir (exists or can be made, writable), storage.socket_path (the agent socket
// fits a sockaddr_un), storage.space (statvfs: bytes and inodes), storage.fstype (statfs: can
// it be idmapped), storage.disk_caps (the ns runtime's DiskProvider::Probe: mke2fs, loop
// control, ext4, fsopen).
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/ids.h"
#include "runtime/doctor/checks.h"
#include "runtime/ns/disk_image.h"

namespace sbx::runtime::doctor {

CheckResult ClassifySpace(uint64_t free_bytes, uint64_t free_inodes, bool inodes_known) {
  if (free_bytes < kSpaceFailBytes || (inodes_known && free_inodes < kInodesFail)) {
    return CheckResult::kFail;
  }
  if (free_bytes < kSpaceWarnBytes || (inodes_known && free_inodes < kInodesWarn)) {
    return CheckResult::kWarn;
  }
  return CheckResult::kOk;
}

std::string FsTypeName(int64_t f_type) {
  // <linux/magic.h> values; the header is not included to keep this list the only source.
  switch (static_cast<uint32_t>(f_type)) {
    case 0xEF53u: return "ext4";  // ext2/3/4 share the magic
    case 0x58465342u: return "xfs";
    case 0x9123683Eu: return "btrfs";
    case 0x01021994u: return "tmpfs";
    case 0x794c7630u: return "overlay";
    case 0x6969u: return "nfs";
    case 0x65735546u: return "fuse";
    case 0x2FC12FC1u: return "zfs";
    case 0x01021997u: return "9p";
    case 0x9fa0u: return "proc";
    case 0x73717368u: return "squashfs";
    case 0xF2F52010u: return "f2fs";
    case 0x858458f6u: return "ramfs";
    case 0x6a656a63u: return "virtiofs";
  }
  return fmt::format("0x{:x}", static_cast<uint64_t>(f_type));
}

bool FsTypeIdmappable(const std::string& name, const std::optional<KernelVersion>& kernel) {
  if (name == "ext4" || name == "xfs" || name == "btrfs" || name == "f2fs") {
    return !kernel || kernel->AtLeast(5, 12);
  }
  if (name == "tmpfs") return kernel && kernel->AtLeast(6, 3);
  return false;
}

size_t AgentSocketPathLength(const std::string& state_dir) {
  // <state>/sandboxes/<id>/agent.sock, as both runtimes build it.
  return fmt::format("{}/sandboxes/{}/agent.sock", state_dir, NewId("sbx")).size();
}

size_t MaxSocketPathLength() { return sizeof(sockaddr_un::sun_path) - 1; }

namespace {

std::string HumanBytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1ull << 30));
  return fmt::format("{:.0f} MiB", static_cast<double>(b) / (1ull << 20));
}

// The state dir if it exists, else its nearest existing ancestor (host view).
std::string ExistingAncestor(const Context& ctx, const std::string& dir) {
  std::string p = dir;
  while (!p.empty() && p != "/") {
    if (ctx.Exists(p)) return p;
    size_t slash = p.rfind('/');
    p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
  }
  return "/";
}

bool AbsoluteStateDir(const Context& ctx) {
  return !ctx.opts.state_dir.empty() && ctx.opts.state_dir[0] == '/';
}

void CheckStateDir(const Context& ctx) {
  Check c{"storage.state_dir", "state directory", CheckResult::kOk, "", "", true};
  const std::string& dir = ctx.opts.state_dir;
  if (!AbsoluteStateDir(ctx)) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("the state dir \"{}\" is not an absolute path", dir);
    c.remedy = "pass --state-dir /absolute/path";
    ctx.Add(std::move(c));
    return;
  }
  const std::string host = ctx.Host(dir);
  struct stat st;
  if (::stat(host.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      c.result = CheckResult::kFail;
      c.detail = fmt::format("{} exists but is not a directory", host);
      c.remedy = "remove it or pick another --state-dir";
    } else if (::access(host.c_str(), W_OK | X_OK) != 0) {
      c.result = CheckResult::kFail;
      c.detail = fmt::format("{} is not writable: access(W_OK): {}", host, ErrnoText(errno));
      c.remedy = "run as root, or fix its owner and mode (sbxd keeps 0700 directories there); a "
                 "read-only mount needs a writable state dir elsewhere";
    } else {
      c.detail = fmt::format("{} exists and is writable", host);
    }
  } else if (errno != ENOENT) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("stat({}): {}", host, ErrnoText(errno));
    c.remedy = "fix the path's permissions or pick another --state-dir";
  } else {
    const std::string parent = ExistingAncestor(ctx, dir);
    const std::string host_parent = ctx.Host(parent);
    if (::access(host_parent.c_str(), W_OK | X_OK) != 0) {
      c.result = CheckResult::kFail;
      c.detail = fmt::format("{} does not exist and cannot be created: {} is not writable ({})",
                             host, host_parent, ErrnoText(errno));
      c.remedy = fmt::format("create {} as root (mkdir -p -m 0700), or pick another --state-dir", dir);
    } else {
      c.detail = fmt::format("{} does not exist yet; sbxd creates it (in {}, writable)", host, host_parent);
    }
  }
  ctx.Add(std::move(c));
}

void CheckSocketPath(const Context& ctx) {
  if (!AbsoluteStateDir(ctx)) return;
  Check c{"storage.socket_path", "agent socket path length", CheckResult::kOk, "", "", true};
  const size_t len = AgentSocketPathLength(ctx.opts.state_dir);
  const size_t max = MaxSocketPathLength();
  if (len > max) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("each sandbox's agent socket <state>/sandboxes/<id>/agent.sock would be {} "
                           "bytes, over the {} a unix socket address holds: every create would fail",
                           len, max);
    c.remedy = fmt::format("use a state dir of at most {} characters (this one has {})",
                           ctx.opts.state_dir.size() - (len - max), ctx.opts.state_dir.size());
  } else {
    c.detail = fmt::format("agent sockets take {} of {} bytes", len, max);
  }
  ctx.Add(std::move(c));
}

void CheckSpaceAndType(const Context& ctx) {
  if (!AbsoluteStateDir(ctx)) return;
  const bool fstype_required = false;  // fs.idmap is the real test; this row explains it
  if (!ctx.live) {
    ctx.AddNotProbed("storage.space", "free space in the state dir", true);
    if (ctx.Wants(fstype_required)) ctx.AddNotProbed("storage.fstype", "state dir file system", false);
    return;
  }
  const std::string dir = ExistingAncestor(ctx, ctx.opts.state_dir);
  Check space{"storage.space", "free space in the state dir", CheckResult::kOk, "", "", true};
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    space.result = CheckResult::kFail;
    space.detail = fmt::format("statvfs({}): {}", dir, ErrnoText(errno));
    space.remedy = "see the errno";
  } else {
    const uint64_t bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    const bool inodes_known = vfs.f_files > 0;  // btrfs and some others do not count inodes
    const uint64_t inodes = vfs.f_favail;
    space.result = ClassifySpace(bytes, inodes, inodes_known);
    space.detail = fmt::format("{} free{} on the file system of {}", HumanBytes(bytes),
                               inodes_known ? fmt::format(", {} inodes", inodes) : "", dir);
    if (space.result != CheckResult::kOk) {
      space.detail += fmt::format(" (below {}: sandbox disks, images and logs live there)",
                                  space.result == CheckResult::kFail ? "256 MiB / 1000 inodes"
                                                                     : "2 GiB / 10000 inodes");
      space.remedy = "free space there or move --state-dir to a larger file system (disk images are "
                     "sparse, but each sandbox's writes land there)";
    }
  }
  ctx.Add(std::move(space));

  if (!ctx.Wants(fstype_required)) return;
  Check type{"storage.fstype", "state dir file system", CheckResult::kOk, "", "", false};
  struct statfs sfs;
  if (::statfs(dir.c_str(), &sfs) != 0) {
    type.result = CheckResult::kWarn;
    type.detail = fmt::format("statfs({}): {}", dir, ErrnoText(errno));
    type.remedy = "see the errno";
  } else {
    std::optional<KernelVersion> kernel;
    if (auto rel = ctx.Read("/proc/sys/kernel/osrelease"); rel.ok()) kernel = ParseKernelRelease(*rel);
    const std::string name = FsTypeName(static_cast<int64_t>(sfs.f_type));
    const bool idmap = FsTypeIdmappable(name, kernel);
    type.detail = fmt::format("{} is on {}{}", dir, name,
                              idmap ? " (can be idmapped)" : " (not known to support idmapped mounts)");
    if (!idmap && ctx.ns && ctx.opts.user_namespaces) {
      type.result = CheckResult::kWarn;
      type.detail += "; fs.idmap says whether it works";
      type.remedy = "if fs.idmap fails: put the state dir on ext4, xfs or btrfs (tmpfs needs Linux 6.3)";
    }
  }
  ctx.Add(std::move(type));
}

void CheckDiskCaps(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required) || !AbsoluteStateDir(ctx)) return;
  if (!ctx.live) return ctx.AddNotProbed("storage.disk_caps", "sandbox disk caps", required);
  if (ctx.opts.skip_backend_probes) {
    return ctx.Add(Check{"storage.disk_caps", "sandbox disk caps", CheckResult::kSkip,
                         "left to the ns backend's DiskProvider::Probe, right after", "", required});
  }
  Check c{"storage.disk_caps", "sandbox disk caps", CheckResult::kOk, "", "", required};
  ns::DiskProvider disks(ctx.opts.state_dir, 0, 0);
  if (absl::Status st = disks.Probe(); !st.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(st.message());
    c.remedy = c.detail.find("mke2fs") != std::string::npos
                   ? "install e2fsprogs (apt-get install e2fsprogs), or put mke2fs on PATH"
                   : "see the message: it names the missing piece";
  } else {
    c.detail = "mke2fs found, loop control opens, ext4 known, fsopen(ext4) works";
  }
  ctx.Add(std::move(c));
}

}  // namespace

void CheckStorage(const Context& ctx) {
  CheckStateDir(ctx);
  CheckSocketPath(ctx);
  CheckSpaceAndType(ctx);
  CheckDiskCaps(ctx);
}

}  // namespace sbx::runtime::doctor
