// Resolution of client-supplied paths inside a sandbox's root, done by the agent (never by
// sbxd, which would race with the sandbox's own processes changing the tree).
//
// Every lookup goes through openat2(root_fd, path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS):
// the kernel treats root_fd as "/" for the whole walk, so `..`, absolute symlinks (`ln -s /
// escape`) and a directory swapped for a symlink mid-walk all stay inside the root, and
// /proc/self/fd-style magic links (which would jump anywhere) are refused. Operations that
// create, rename or delete resolve the PARENT that way and act on the last component with
// *at() calls on the parent's fd, so a symlink planted at the last component is never
// followed either.
//
// Paths are validated lexically first (ValidatePath, a pure function; see the fuzz target
// tests/fuzz/path_resolve_fuzz.cc): non-empty, no NUL, valid UTF-8, at most kMaxPathBytes,
// components at most kMaxNameBytes, and a `..` may not climb above "/" (400
// path_outside_root: the kernel would contain it anyway, but a client asking for it is wrong
// and should hear so). A relative path is relative to the workdir (the template's workdir,
// also the default cwd of sessions).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace sbx {

inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxNameBytes = 255;

// The absolute, lexically normalized form of `path` (no "." or "..", no repeated or trailing
// slashes; "/" for the root), `path` being relative to `workdir` unless absolute. Errors are
// InvalidArgument with the reason in the message; the API code is in ValidationReason.
absl::StatusOr<std::string> ValidatePath(std::string_view path, std::string_view workdir = "/");

// Whether `s` is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Splits a normalized absolute path into parent and last component ("/a/b" -> "/a", "b").
// The root has no last component: InvalidArgument.
absl::StatusOr<std::pair<std::string, std::string>> SplitParent(std::string_view normalized);

// openat2(root_fd, path, {flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS}) with EAGAIN
// (a concurrent rename elsewhere in the mount) retried a bounded number of times. `path` is a
// normalized absolute path; the leading '/' is fine with RESOLVE_IN_ROOT. Returns the errno
// as an error status naming `what`.
absl::StatusOr<UniqueFd> OpenInRoot(int root_fd, std::string_view path, int flags,
                                    mode_t mode = 0, std::string_view what = "open");

// The parent directory of `normalized` opened (O_PATH | O_DIRECTORY) inside the root, and the
// last component to act on with *at() calls. Only operations that change the tree (create,
// write, mkdir, delete, move, untar) use it: a parent on a kernel interface file system
// (KernelFsName) is refused with 403 permission_denied, whatever errno the kernel would give.
struct ParentRef {
  UniqueFd dir;
  std::string name;
};
absl::StatusOr<ParentRef> OpenParent(int root_fd, std::string_view normalized);

// "proc", "sysfs", "cgroup2", ... for the statfs f_type of a file system whose files are the
// kernel's interfaces rather than data; nullopt otherwise.
std::optional<std::string_view> KernelFsName(long f_type);
// PermissionDenied when the file system of `fd` is a kernel interface (see KernelFsName).
absl::Status RefuseKernelFs(int fd, std::string_view path, std::string_view what);
// PermissionDenied when p.name is a mount point (another mount than its parent's): a delete
// or move of it would fail with EBUSY, a recursive delete only after it emptied the mount.
absl::Status RefuseMountPoint(const ParentRef& p, std::string_view path, std::string_view what);
// The mount id (statx STATX_MNT_ID) of `name` in `dir` ("" for `dir` itself), not following a
// symlink; nullopt when the kernel does not report one.
absl::StatusOr<std::optional<uint64_t>> MountIdAt(int dir, const char* name);

// Maps an errno of a file operation to a status whose message names the step and the errno,
// with the canonical code sbxd turns into HTTP (ENOENT -> NotFound, EEXIST -> AlreadyExists,
// EISDIR/ENOTDIR/ENOTEMPTY -> FailedPrecondition, EACCES/EPERM/EROFS/EBUSY -> PermissionDenied,
// ENOSPC/EDQUOT -> ResourceExhausted, ENAMETOOLONG/ELOOP/EINVAL -> InvalidArgument).
absl::Status FileErrnoStatus(int err, std::string_view what);
// The specific reason code for an error made by FileErrnoStatus or ValidatePath ("not_found",
// "is_a_directory", "insufficient_storage", "path_outside_root", ...).
std::string FileErrorReason(const absl::Status& s);

}  // namespace sbx
