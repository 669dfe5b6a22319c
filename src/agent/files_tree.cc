// stat, list, mkdir, delete and move: ops that answer with one response.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "agent/files_internal.h"
#include "common/path_resolve.h"
#include "archive/untar.h"  // MkdirParents
#include "common/unique_fd.h"
#include "protocol/limits.h"

namespace sbx::agent::fileops {

using archive::MkdirParents;

absl::StatusOr<Json> OpStat(const protocol::StatRequest& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, ValidatePath(req.path, o.workdir));
  SBX_ASSIGN_OR_RETURN(protocol::FileEntry e, StatEntry(o.root_fd, path));
  return protocol::EntryReply{std::move(e)}.ToJson();
}

namespace {

// Appends the entries below `dir` (sorted, depth-first) to `out` until it is full. A
// directory's names are collected into a bounded set: only the first `room` names in sorted
// order can ever be reported, and a guest's directory may hold millions.
void ListDir(int dir, const std::string& path, int depth, ListReply& out) {
  UniqueFd copy(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!copy) return;
  DIR* d = ::fdopendir(copy.get());
  if (!d) return;
  copy.Release();
  const size_t room = protocol::kMaxListEntries - std::min(out.entries(), protocol::kMaxListEntries);
  std::set<std::string> names;
  while (dirent* de = ::readdir(d)) {
    std::string_view n = de->d_name;
    if (n == "." || n == "..") continue;
    if (names.size() >= room) {
      // The name is past the room unless it sorts before the largest one kept.
      out.MarkTruncated();
      if (room == 0 || n >= *names.rbegin()) continue;
      names.erase(std::prev(names.end()));
    }
    names.emplace(n);
  }
  for (const std::string& n : names) {
    if (out.full()) break;
    const std::string child = path == "/" ? "/" + n : path + "/" + n;
    // A path past the field bound is left out rather than reported cut (a cut path names
    // another file); a deep tree of long names gets there within depth 32.
    if (child.size() > protocol::kMaxFieldBytes) {
      out.MarkTruncated();
      continue;
    }
    struct stat st {};
    if (::fstatat(::dirfd(d), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!out.Add(EntryOf(st, child, ::dirfd(d), n).ToJson())) break;
    if (S_ISDIR(st.st_mode) && depth > 1) {
      UniqueFd sub(::openat(::dirfd(d), n.c_str(),
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub) ListDir(sub.get(), child, depth - 1, out);
    }
  }
  ::closedir(d);
}

// Removes everything below `dir`'s entry `name` (a directory), then the directory itself.
// Every step is relative to an fd opened with O_NOFOLLOW: a symlink inside is unlinked, never
// followed.
absl::Status RemoveTree(int dir, const std::string& name, const std::string& path, int depth) {
  if (depth > kMaxTreeDepth) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "too_deep",
                    fmt::format("delete {}: deeper than {} levels", path, kMaxTreeDepth));
  }
  UniqueFd fd(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return FileErrnoStatus(errno, fmt::format("delete {}: openat", path));
  for (;;) {
    // Re-read after each batch of removals: readdir over a changing directory may skip.
    SBX_ASSIGN_OR_RETURN(std::vector<std::string> names, DirNames(fd.get(), "delete", path));
    if (names.empty()) break;
    for (const std::string& n : names) {
      if (::unlinkat(fd.get(), n.c_str(), 0) == 0 || errno == ENOENT) continue;
      const int unlink_errno = errno;
      if (unlink_errno != EISDIR && unlink_errno != EPERM) {
        return FileErrnoStatus(unlink_errno, fmt::format("delete {}/{}: unlinkat", path, n));
      }
      // EPERM on something that is not a directory is a refusal, not a directory to descend
      // into; a directory on another file system is a mount point, which stays.
      struct stat child {};
      if (::fstatat(fd.get(), n.c_str(), &child, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;
        return FileErrnoStatus(errno, fmt::format("delete {}/{}: fstatat", path, n));
      }
      if (!S_ISDIR(child.st_mode)) {
        return FileErrnoStatus(unlink_errno, fmt::format("delete {}/{}: unlinkat", path, n));
      }
      SBX_RETURN_IF_ERROR(RefuseMountPoint(ParentRef{UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0)), n},
                                           path + "/" + n, "delete"));
      SBX_RETURN_IF_ERROR(RemoveTree(fd.get(), n, path + "/" + n, depth + 1));
    }
  }
  if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return FileErrnoStatus(errno, fmt::format("delete {}: unlinkat(AT_REMOVEDIR)", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> OpList(const protocol::ListRequest& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, ValidatePath(req.path, o.workdir));
  const int d = static_cast<int>(req.depth.value_or(1));
  if (d < 1) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    "depth must be at least 1", "depth");
  }
  SBX_ASSIGN_OR_RETURN(UniqueFd dir, OpenInRoot(o.root_fd, path, O_RDONLY | O_DIRECTORY, 0, "list"));
  ListReply reply("entries", protocol::kMaxListEntries);
  ListDir(dir.get(), path, d, reply);
  return reply.Finish();
}

absl::StatusOr<Json> OpMkdir(const protocol::MkdirRequest& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, ValidatePath(req.path, o.workdir));
  const mode_t m = static_cast<mode_t>(req.mode.value_or(0755));
  SBX_ASSIGN_OR_RETURN(Owner owner, UserOwner(req.user, o));
  const auto dir_owner = DirOwner(owner);
  if (req.parents) {
    SBX_RETURN_IF_ERROR(MkdirParents(o.root_fd, path, m, dir_owner));
  } else {
    SBX_ASSIGN_OR_RETURN(ParentRef p, OpenParent(o.root_fd, path));
    if (::mkdirat(p.dir.get(), p.name.c_str(), m) != 0) {
      return FileErrnoStatus(errno, fmt::format("mkdir {}: mkdirat", path));
    }
    if (dir_owner && ::fchownat(p.dir.get(), p.name.c_str(), dir_owner->first,
                                dir_owner->second, AT_SYMLINK_NOFOLLOW) != 0) {
      return FileErrnoStatus(errno, fmt::format("mkdir {}: fchownat", path));
    }
  }
  SBX_ASSIGN_OR_RETURN(protocol::FileEntry e, StatEntry(o.root_fd, path));
  if (e.type != "directory") {
    return ApiError(absl::StatusCode::kAlreadyExists, "already_exists",
                    fmt::format("mkdir {}: exists and is not a directory", path));
  }
  return protocol::EntryReply{std::move(e)}.ToJson();
}

absl::StatusOr<Json> OpDelete(const protocol::DeleteRequest& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, ValidatePath(req.path, o.workdir));
  SBX_ASSIGN_OR_RETURN(ParentRef p, OpenParent(o.root_fd, path));
  // Before a recursive delete empties a mount point whose own removal then fails.
  SBX_RETURN_IF_ERROR(RefuseMountPoint(p, path, "delete"));
  if (::unlinkat(p.dir.get(), p.name.c_str(), 0) == 0) return protocol::OkReply{}.ToJson();
  const int unlink_errno = errno;
  if (unlink_errno != EISDIR && unlink_errno != EPERM) {
    return FileErrnoStatus(unlink_errno, fmt::format("delete {}: unlinkat", path));
  }
  if (::unlinkat(p.dir.get(), p.name.c_str(), AT_REMOVEDIR) == 0) {
    return protocol::OkReply{}.ToJson();
  }
  if ((errno == ENOTEMPTY || errno == EEXIST) && req.recursive) {
    SBX_RETURN_IF_ERROR(RemoveTree(p.dir.get(), p.name, path, 0));
    return protocol::OkReply{}.ToJson();
  }
  // EPERM from unlink is how Linux says "a directory" and also "not allowed" (sticky
  // directory, immutable file): when the entry is no directory, the EPERM was the answer.
  if (errno == ENOTDIR && unlink_errno == EPERM) {
    return FileErrnoStatus(EPERM, fmt::format("delete {}: unlinkat", path));
  }
  return FileErrnoStatus(errno == EEXIST ? ENOTEMPTY : errno,
                         fmt::format("delete {}: unlinkat(AT_REMOVEDIR)", path));
}

absl::StatusOr<Json> OpMove(const protocol::MoveRequest& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string from, ValidatePath(req.from, o.workdir));
  SBX_ASSIGN_OR_RETURN(std::string to, ValidatePath(req.to, o.workdir));
  if (to.size() > from.size() && to.compare(0, from.size(), from) == 0 && to[from.size()] == '/') {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                    fmt::format("move {} to {}: a directory cannot move into itself", from, to),
                    "to");
  }
  SBX_ASSIGN_OR_RETURN(ParentRef f, OpenParent(o.root_fd, from));
  SBX_ASSIGN_OR_RETURN(ParentRef t, OpenParent(o.root_fd, to));
  SBX_RETURN_IF_ERROR(RefuseMountPoint(f, from, "move"));
  const unsigned flags = req.overwrite ? 0 : RENAME_NOREPLACE;
  if (::renameat2(f.dir.get(), f.name.c_str(), t.dir.get(), t.name.c_str(), flags) != 0) {
    return FileErrnoStatus(errno, fmt::format("move {} to {}: renameat2", from, to));
  }
  SBX_ASSIGN_OR_RETURN(protocol::FileEntry e, StatEntry(o.root_fd, to));
  return protocol::EntryReply{std::move(e)}.ToJson();
}

}  // namespace sbx::agent::fileops
