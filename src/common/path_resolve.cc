#include "common/path_resolve.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx {
namespace {

absl::Status Invalid(std::string_view reason, std::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, reason, message, "path");
}

// configfs has no constant in linux/magic.h.
constexpr long kConfigfsMagic = 0x62656570;


}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

absl::StatusOr<std::string> ValidatePath(std::string_view path, std::string_view workdir) {
  if (path.empty()) return Invalid("invalid_path", "path is empty");
  if (path.size() > kMaxPathBytes) {
    return Invalid("invalid_path",
                   fmt::format("path is {} bytes long, the maximum is {}", path.size(), kMaxPathBytes));
  }
  if (path.find('\0') != std::string_view::npos) {
    return Invalid("invalid_path", "path contains a NUL byte");
  }
  if (!IsValidUtf8(path)) return Invalid("invalid_path", "path is not valid UTF-8");

  std::vector<std::string_view> parts;
  auto walk = [&](std::string_view p, bool is_workdir) -> absl::Status {
    size_t pos = 0;
    while (pos <= p.size()) {
      size_t slash = p.find('/', pos);
      if (slash == std::string_view::npos) slash = p.size();
      std::string_view comp = p.substr(pos, slash - pos);
      pos = slash + 1;
      if (comp.empty() || comp == ".") continue;
      if (comp.size() > kMaxNameBytes) {
        return Invalid("invalid_path", fmt::format("a path component is {} bytes long, the "
                                                   "maximum is {}",
                                                   comp.size(), kMaxNameBytes));
      }
      if (comp == "..") {
        if (parts.empty()) {
          return Invalid("path_outside_root",
                         is_workdir ? "the workdir climbs above the sandbox's root"
                                    : "path climbs above the sandbox's root with '..'");
        }
        parts.pop_back();
        continue;
      }
      parts.push_back(comp);
    }
    return absl::OkStatus();
  };
  if (path[0] != '/') {
    // The workdir comes from the agent's options, not the client; checked all the same so
    // that the result is always well-formed.
    if (workdir.find('\0') != std::string_view::npos || !IsValidUtf8(workdir)) {
      return Invalid("invalid_path", "the workdir is not a valid path");
    }
    SBX_RETURN_IF_ERROR(walk(workdir, true));
  }
  SBX_RETURN_IF_ERROR(walk(path, false));
  std::string out;
  for (std::string_view c : parts) {
    out += '/';
    out += c;
  }
  if (out.empty()) out = "/";
  if (out.size() > kMaxPathBytes) {
    return Invalid("invalid_path", "path is too long once joined with the workdir");
  }
  return out;
}

absl::StatusOr<std::pair<std::string, std::string>> SplitParent(std::string_view normalized) {
  if (normalized.empty() || normalized[0] != '/' || normalized == "/") {
    return Invalid("invalid_path", "the sandbox's root directory itself cannot be the target");
  }
  const size_t slash = normalized.rfind('/');
  std::string parent(normalized.substr(0, slash));
  if (parent.empty()) parent = "/";
  return std::make_pair(parent, std::string(normalized.substr(slash + 1)));
}

absl::StatusOr<UniqueFd> OpenInRoot(int root_fd, std::string_view path, int flags, mode_t mode,
                                    std::string_view what) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  // The kernel rejects a mode without O_CREAT/O_TMPFILE.
  how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  const std::string p(path);
  for (int attempt = 0;; ++attempt) {
    long fd = ::syscall(SYS_openat2, root_fd, p.c_str(), &how, sizeof(how));
    if (fd >= 0) return UniqueFd(static_cast<int>(fd));
    // EAGAIN: a rename raced with the lookup (the kernel cannot prove containment); retrying
    // is what the man page asks for.
    if ((errno == EAGAIN || errno == EINTR) && attempt < 64) continue;
    return FileErrnoStatus(errno, fmt::format("{} {}: openat2", what, p));
  }
}

std::optional<std::string_view> KernelFsName(long f_type) {
  switch (f_type) {
    case PROC_SUPER_MAGIC: return "proc";
    case SYSFS_MAGIC: return "sysfs";
    case CGROUP_SUPER_MAGIC: return "cgroup";
    case CGROUP2_SUPER_MAGIC: return "cgroup2";
    case DEBUGFS_MAGIC: return "debugfs";
    case TRACEFS_MAGIC: return "tracefs";
    case SECURITYFS_MAGIC: return "securityfs";
    case SELINUX_MAGIC: return "selinuxfs";
    case SMACK_MAGIC: return "smackfs";
    case BPF_FS_MAGIC: return "bpf";
    case PSTOREFS_MAGIC: return "pstore";
    case EFIVARFS_MAGIC: return "efivarfs";
    case BINFMTFS_MAGIC: return "binfmt_misc";
    case DEVPTS_SUPER_MAGIC: return "devpts";
    case kConfigfsMagic: return "configfs";
    default: return std::nullopt;
  }
}

absl::Status RefuseKernelFs(int fd, std::string_view path, std::string_view what) {
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0) {
    return FileErrnoStatus(errno, fmt::format("{} {}: fstatfs", what, path));
  }
  if (auto name = KernelFsName(static_cast<long>(sfs.f_type))) {
    return ApiError(absl::StatusCode::kPermissionDenied, "permission_denied",
                    fmt::format("{} {}: on the kernel's {} file system, which the files API "
                                "does not change",
                                what, path, *name));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParentRef> OpenParent(int root_fd, std::string_view normalized) {
  SBX_ASSIGN_OR_RETURN(auto split, SplitParent(normalized));
  ParentRef r;
  SBX_ASSIGN_OR_RETURN(r.dir, OpenInRoot(root_fd, split.first, O_PATH | O_DIRECTORY, 0,
                                         "open parent directory"));
  // Before any change: procfs answers a create with ENOENT (its lookup fails first), sysfs
  // with EACCES, and a read-only bind with EROFS, so the errno alone would tell a client
  // "not found" for a directory that plainly exists.
  SBX_RETURN_IF_ERROR(RefuseKernelFs(r.dir.get(), normalized, "change"));
  r.name = std::move(split.second);
  return r;
}

absl::StatusOr<std::optional<uint64_t>> MountIdAt(int dir, const char* name) {
  struct statx stx {};
  const int flags = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | (name[0] == '\0' ? AT_EMPTY_PATH : 0);
  if (::statx(dir, name, flags, STATX_MNT_ID, &stx) != 0) return ErrnoStatus(errno, "statx");
  if ((stx.stx_mask & STATX_MNT_ID) == 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(stx.stx_mnt_id);
}

absl::Status RefuseMountPoint(const ParentRef& p, std::string_view path, std::string_view what) {
  // Mount ids, not st_dev: overlayfs reports its own device for directories but the layer's
  // for files, and a bind mount within one file system keeps the device.
  auto parent = MountIdAt(p.dir.get(), "");
  if (!parent.ok()) return Annotate(parent.status(), fmt::format("{} {}: parent", what, path));
  auto entry = MountIdAt(p.dir.get(), p.name.c_str());
  if (!entry.ok()) {
    if (absl::IsNotFound(entry.status())) return absl::OkStatus();  // the operation says so
    return Annotate(entry.status(), fmt::format("{} {}", what, path));
  }
  // Without mount ids (kernels before 5.8) the EBUSY of the operation itself still says no.
  if (*parent && *entry && **parent != **entry) {
    return ApiError(absl::StatusCode::kPermissionDenied, "permission_denied",
                    fmt::format("{} {}: a mount point of the sandbox, which the files API does "
                                "not remove or move",
                                what, path));
  }
  return absl::OkStatus();
}

absl::Status FileErrnoStatus(int err, std::string_view what) {
  const std::string msg = fmt::format("{}: {}", what, ErrnoMessage(err));
  switch (err) {
    case ENOENT:
      return ApiError(absl::StatusCode::kNotFound, "not_found", msg);
    case EEXIST:
      return ApiError(absl::StatusCode::kAlreadyExists, "already_exists", msg);
    case EISDIR:
      return ApiError(absl::StatusCode::kFailedPrecondition, "is_a_directory", msg);
    case ENOTDIR:
      return ApiError(absl::StatusCode::kFailedPrecondition, "not_a_directory", msg);
    case ENOTEMPTY:
      return ApiError(absl::StatusCode::kFailedPrecondition, "directory_not_empty", msg);
    case EXDEV:
      return ApiError(absl::StatusCode::kFailedPrecondition, "cross_device", msg);
    case EACCES:
    case EPERM:
      return ApiError(absl::StatusCode::kPermissionDenied, "permission_denied", msg);
    case EROFS:
      return ApiError(absl::StatusCode::kPermissionDenied, "read_only_filesystem", msg);
    // A mount point (also a bind mount within one file system, which RefuseMountPoint cannot
    // tell by st_dev) cannot be removed, renamed or replaced from inside: not a transient
    // state worth a retry, as the canonical mapping's Unavailable would say.
    case EBUSY:
      return ApiError(absl::StatusCode::kPermissionDenied, "permission_denied", msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return ApiError(absl::StatusCode::kResourceExhausted, "insufficient_storage", msg);
    case ENAMETOOLONG:
    case ELOOP:
    case EINVAL:
      return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path", msg);
    default:
      return ErrnoStatus(err, what);
  }
}

std::string FileErrorReason(const absl::Status& s) {
  std::string r = ApiErrorCode(s);
  return r.empty() ? "internal" : r;
}

}  // namespace sbx
