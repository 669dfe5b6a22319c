#include "image/layer_unpack.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "archive/untar.h"
#include "common/digest.h"
#include "common/path_resolve.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::image {
namespace {

constexpr size_t kMaxDepth = 512;
constexpr size_t kChunk = 1 << 20;
constexpr uint64_t kProgressEvery = 8 << 20;
// Tar headers, padding and the trailer beside the files' bytes: what the uncompressed stream
// may hold more than the files (a pax header per entry, 10 KiB of trailer, a little slack).
constexpr uint64_t kPerEntryOverhead = 4096;
constexpr uint64_t kStreamSlack = 1 << 20;

struct ArchiveFree {
  void operator()(::archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<::archive, ArchiveFree>;

// The uncompressed stream: the outer archive (raw format, every filter) decompresses the
// blob; the tar reader on top pulls from it through ReadCb, and every byte is hashed.
struct Stream {
  ::archive* outer = nullptr;
  Sha256Stream hash;
  std::vector<char> buf = std::vector<char>(kChunk);
  uint64_t bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t next_progress = kProgressEvery;
  absl::Status error;
  const ProgressFn* progress = nullptr;
  const CancelFn* cancelled = nullptr;

  la_ssize_t Read(const void** out) {
    if (*cancelled && (*cancelled)()) {
      error = absl::CancelledError("layer unpack: cancelled");
      return -1;
    }
    la_ssize_t n = archive_read_data(outer, buf.data(), buf.size());
    if (n < 0) {
      error = absl::InvalidArgumentError(
          fmt::format("layer: decompress: {}", archive_error_string(outer)
                                                   ? archive_error_string(outer)
                                                   : "read error"));
      return -1;
    }
    hash.Update(buf.data(), static_cast<size_t>(n));
    bytes += static_cast<uint64_t>(n);
    if (bytes > max_bytes) {
      error = absl::ResourceExhaustedError(fmt::format(
          "layer: its uncompressed stream is over {} bytes, more than its files may take "
          "(a decompression bomb, or templates.max_image_mib is too small)",
          max_bytes));
      return -1;
    }
    if (bytes >= next_progress && *progress) {
      next_progress = bytes + kProgressEvery;
      Progress p;
      p.stage = "unpacking";
      p.bytes_done = static_cast<uint64_t>(archive_filter_bytes(outer, -1));
      (*progress)(p);
    }
    *out = buf.data();
    return n;
  }
};

la_ssize_t ReadCb(::archive*, void* client, const void** buff) {
  return static_cast<Stream*>(client)->Read(buff);
}

// "a/b/c" of a tar name: no "." or empty components, never above the root.
absl::StatusOr<std::string> CleanName(const char* raw) {
  if (raw == nullptr) return absl::InvalidArgumentError("layer: an entry without a name");
  std::string_view s(raw);
  if (s.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(fmt::format("layer: a name of {} bytes (at most {})",
                                                  s.size(), kMaxPathBytes));
  }
  std::string out;
  size_t depth = 0;
  while (!s.empty()) {
    const size_t slash = s.find('/');
    std::string_view c = s.substr(0, slash);
    s = slash == std::string_view::npos ? std::string_view() : s.substr(slash + 1);
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      return absl::InvalidArgumentError(
          fmt::format("layer: entry \"{}\" names a path outside the layer (..)", raw));
    }
    if (c.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(fmt::format("layer: entry \"{:.64}…\": a name is longer "
                                                    "than {} bytes", raw, kMaxNameBytes));
    }
    if (++depth > kMaxDepth) {
      return absl::InvalidArgumentError(fmt::format(
          "layer: entry \"{:.64}…\" nests deeper than {} directories", raw, kMaxDepth));
    }
    if (!out.empty()) out.push_back('/');
    out.append(c);
  }
  return out;
}

std::pair<std::string, std::string> Split(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  if (slash == std::string::npos) return {"", rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

// Removes `name` in `dir` and, for a directory, all it holds, through fds only (nothing of a
// path is re-resolved, so a symlink cannot redirect the removal). Depth first with an explicit
// stack of open directories, not recursion: a tree may nest as deep as CleanName allows, and a
// tree made some other way (a store left by another version) is bounded by kMaxRemoveDepth.
absl::Status RemoveAt(int dir, const char* name) {
  constexpr size_t kMaxRemoveDepth = 4 * kMaxDepth;
  struct stat st {};
  if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, fmt::format("fstatat({})", name));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dir, name, 0) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, fmt::format("unlinkat({})", name));
    }
    return absl::OkStatus();
  }
  struct Level {
    DIR* d;
    std::string name;     // in the level above (or `dir` for the first)
    bool removed = false;  // something went in this pass over it: read it again
  };
  std::vector<Level> stack;
  auto close_all = [&] {
    for (auto& l : stack) ::closedir(l.d);
  };
  auto open_level = [&](int parent, const std::string& n) -> absl::Status {
    if (stack.size() >= kMaxRemoveDepth) return absl::InternalError("remove: the tree nests too deep");
    int fd = ::openat(parent, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, fmt::format("openat({})", n));
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      ::close(fd);
      return ErrnoStatus(errno, "fdopendir");
    }
    stack.push_back(Level{d, n});
    return absl::OkStatus();
  };
  if (absl::Status st_open = open_level(dir, name); !st_open.ok()) return st_open;
  while (!stack.empty()) {
    Level& top = stack.back();
    errno = 0;
    dirent* e = ::readdir(top.d);
    if (e != nullptr) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      const int fd = ::dirfd(top.d);
      struct stat est {};
      if (::fstatat(fd, e->d_name, &est, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone already
      top.removed = true;
      if (S_ISDIR(est.st_mode)) {
        if (absl::Status st_open = open_level(fd, e->d_name); !st_open.ok()) {
          close_all();
          return st_open;
        }
      } else if (::unlinkat(fd, e->d_name, 0) != 0 && errno != ENOENT) {
        const int err = errno;
        close_all();
        return ErrnoStatus(err, fmt::format("unlinkat({})", e->d_name));
      }
      continue;
    }
    // A directory read while it lost entries may have skipped some: read it again until a
    // whole pass finds it empty.
    if (top.removed) {
      top.removed = false;
      ::rewinddir(top.d);
      continue;
    }
    const std::string done = top.name;
    ::closedir(top.d);
    stack.pop_back();
    const int parent = stack.empty() ? dir : ::dirfd(stack.back().d);
    if (::unlinkat(parent, done.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      const int err = errno;
      close_all();
      return ErrnoStatus(err, fmt::format("rmdir({})", done));
    }
  }
  return absl::OkStatus();
}

// Writes the entries of one layer under the root fd.
class Writer {
 public:
  Writer(int root, const UnpackLimits& limits, UnpackResult& res)
      : root_(root), limits_(limits), res_(res) {}

  absl::Status Entry(::archive* a, archive_entry* e) {
    SBX_ASSIGN_OR_RETURN(std::string rel, CleanName(archive_entry_pathname(e)));
    const mode_t type = archive_entry_filetype(e);
    if (rel.empty()) {  // "./": the layer's root directory itself
      if (type != AE_IFDIR) return absl::InvalidArgumentError("layer: the root is not a directory");
      return SetAttrs(root_, e, /*dir=*/true, "");
    }
    auto [parent, name] = Split(rel);
    SBX_ASSIGN_OR_RETURN(int pfd, Parent(parent));
    if (name.rfind(".wh.", 0) == 0) return Whiteout(pfd, parent, name);
    if (const char* link = archive_entry_hardlink(e); link != nullptr) {
      return HardLink(pfd, name, link, rel);
    }
    switch (type) {
      case AE_IFDIR:
        return Dir(pfd, name, rel, e);
      case AE_IFREG:
        return File(a, pfd, name, rel, e);
      case AE_IFLNK: {
        const char* target = archive_entry_symlink(e);
        if (target == nullptr || std::strlen(target) > kMaxPathBytes) {
          return absl::InvalidArgumentError(fmt::format("layer: symlink {}: bad target", rel));
        }
        SBX_RETURN_IF_ERROR(Replace(pfd, name));
        if (::symlinkat(target, pfd, name.c_str()) != 0) {
          return ErrnoStatus(errno, fmt::format("layer: symlinkat({})", rel));
        }
        ::fchownat(pfd, name.c_str(), archive_entry_uid(e), archive_entry_gid(e),
                   AT_SYMLINK_NOFOLLOW);
        timespec ts[2] = {{archive_entry_mtime(e), archive_entry_mtime_nsec(e)},
                          {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
        ::utimensat(pfd, name.c_str(), ts, AT_SYMLINK_NOFOLLOW);
        return absl::OkStatus();
      }
      case AE_IFIFO:
        SBX_RETURN_IF_ERROR(Replace(pfd, name));
        if (::mknodat(pfd, name.c_str(), S_IFIFO | (archive_entry_perm(e) & 0777), 0) != 0) {
          return ErrnoStatus(errno, fmt::format("layer: mknodat({}, fifo)", rel));
        }
        ::fchownat(pfd, name.c_str(), archive_entry_uid(e), archive_entry_gid(e),
                   AT_SYMLINK_NOFOLLOW);
        return absl::OkStatus();
      case AE_IFCHR:
        // A 0/0 character device is overlayfs' own whiteout, which some tools write as is.
        if (archive_entry_rdev(e) == 0) return MakeWhiteout(pfd, name, rel);
        [[fallthrough]];
      default:
        ++res_.skipped;  // devices and sockets: a sandbox has its own /dev
        return absl::OkStatus();
    }
  }

  // Directory mtimes last: writing their entries changed them.
  absl::Status Finish() {
    std::sort(dir_times_.begin(), dir_times_.end(), [](const auto& x, const auto& y) {
      return std::count(x.first.begin(), x.first.end(), '/') >
             std::count(y.first.begin(), y.first.end(), '/');
    });
    for (const auto& [rel, ts] : dir_times_) {
      auto fd = OpenInRoot(root_, "/" + rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (!fd.ok()) continue;  // replaced by a later entry
      timespec both[2] = {ts, ts};
      ::futimens(fd->get(), both);
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<int> Parent(const std::string& parent) {
    if (parent.empty()) return root_;
    if (parent == parent_path_ && parent_fd_) return parent_fd_.get();
    SBX_RETURN_IF_ERROR(archive::MkdirParents(root_, "/" + parent, 0755));
    SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenInRoot(root_, "/" + parent,
                                                 O_PATH | O_DIRECTORY | O_CLOEXEC, 0,
                                                 "layer: open parent"));
    parent_fd_ = std::move(fd);
    parent_path_ = parent;
    return parent_fd_.get();
  }

  // An entry replaces what an earlier entry of the layer put at its name (the last one wins,
  // as in docker's extraction). The cached parent fd stays valid: it is this entry's parent,
  // never under what goes.
  absl::Status Replace(int pfd, const std::string& name) {
    // A directory that goes may hold the cached parent of a later entry: drop the cache, but
    // keep its fd open until the next entry (this one's pfd may be it).
    struct stat st {};
    if (::fstatat(pfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      retired_ = std::move(parent_fd_);
      parent_path_.clear();
    }
    return RemoveAt(pfd, name.c_str());
  }

  absl::Status MakeWhiteout(int pfd, const std::string& name, const std::string& rel) {
    SBX_RETURN_IF_ERROR(Replace(pfd, name));
    if (::mknodat(pfd, name.c_str(), S_IFCHR | 0, makedev(0, 0)) != 0) {
      return ErrnoStatus(errno, fmt::format("layer: whiteout mknodat({}, 0/0)", rel));
    }
    return absl::OkStatus();
  }

  absl::Status Whiteout(int pfd, const std::string& parent, const std::string& name) {
    if (name == ".wh..wh..opq") {
      SBX_ASSIGN_OR_RETURN(UniqueFd dir,
                           OpenInRoot(root_, "/" + parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                                      0, "layer: open opaque directory"));
      for (const char* x : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
        if (::fsetxattr(dir.get(), x, "y", 1, 0) != 0) {
          return ErrnoStatus(errno, fmt::format("layer: fsetxattr({}, {})", parent, x));
        }
      }
      return absl::OkStatus();
    }
    const std::string target = name.substr(4);
    if (target.empty() || target == "." || target == "..") {
      return absl::InvalidArgumentError(fmt::format("layer: bad whiteout {}/{}", parent, name));
    }
    return MakeWhiteout(pfd, target, parent.empty() ? target : parent + "/" + target);
  }

  absl::Status HardLink(int pfd, const std::string& name, const char* link,
                        const std::string& rel) {
    SBX_ASSIGN_OR_RETURN(std::string to, CleanName(link));
    if (to.empty() || to == rel) {
      return absl::InvalidArgumentError(fmt::format("layer: hard link {} to itself", rel));
    }
    auto [tparent, tname] = Split(to);
    auto tdir = OpenInRoot(root_, "/" + tparent, O_PATH | O_DIRECTORY | O_CLOEXEC, 0,
                           "layer: hard link target");
    if (!tdir.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("layer: hard link {} names {}, which the layer does not hold", rel, to));
    }
    SBX_RETURN_IF_ERROR(Replace(pfd, name));
    SBX_ASSIGN_OR_RETURN(int pfd2, Parent(Split(rel).first));
    if (::linkat(tdir->get(), tname.c_str(), pfd2, name.c_str(), 0) != 0) {
      if (errno == ENOENT) {
        return absl::InvalidArgumentError(
            fmt::format("layer: hard link {} names {}, which the layer does not hold", rel, to));
      }
      return ErrnoStatus(errno, fmt::format("layer: linkat({} -> {})", rel, to));
    }
    return absl::OkStatus();
  }

  absl::Status Dir(int pfd, const std::string& name, const std::string& rel, archive_entry* e) {
    struct stat st {};
    if (::fstatat(pfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) {
      SBX_RETURN_IF_ERROR(Replace(pfd, name));
      SBX_ASSIGN_OR_RETURN(pfd, Parent(Split(rel).first));
    }
    if (::mkdirat(pfd, name.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, fmt::format("layer: mkdirat({})", rel));
    }
    int fd = ::openat(pfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, fmt::format("layer: open({})", rel));
    UniqueFd owned(fd);
    SBX_RETURN_IF_ERROR(SetAttrs(fd, e, /*dir=*/true, rel));
    return absl::OkStatus();
  }

  absl::Status File(::archive* a, int pfd, const std::string& name, const std::string& rel,
                    archive_entry* e) {
    const int64_t declared = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    if (declared < 0) return absl::InvalidArgumentError(fmt::format("layer: {}: bad size", rel));
    res_.unpacked_bytes += static_cast<uint64_t>(declared);
    if (res_.unpacked_bytes > limits_.max_bytes) return TooBig(rel);
    SBX_RETURN_IF_ERROR(Replace(pfd, name));
    SBX_ASSIGN_OR_RETURN(pfd, Parent(Split(rel).first));
    int fd = ::openat(pfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600);
    if (fd < 0) return ErrnoStatus(errno, fmt::format("layer: create({})", rel));
    UniqueFd owned(fd);
    const void* buf = nullptr;
    size_t size = 0;
    la_int64_t offset = 0;
    uint64_t written = 0;
    for (;;) {
      int r = archive_read_data_block(a, &buf, &size, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ReadError(a, rel);
      written += size;
      if (offset < 0 || written > static_cast<uint64_t>(declared) + kChunk) return TooBig(rel);
      const char* p = static_cast<const char*>(buf);
      size_t left = size;
      off_t at = offset;
      while (left > 0) {
        ssize_t w = ::pwrite(fd, p, left, at);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return ErrnoStatus(errno, fmt::format("layer: write({})", rel));
        p += w;
        left -= static_cast<size_t>(w);
        at += w;
      }
    }
    // A sparse file's trailing hole.
    if (::ftruncate(fd, declared) != 0) {
      return ErrnoStatus(errno, fmt::format("layer: ftruncate({})", rel));
    }
    return SetAttrs(fd, e, /*dir=*/false, rel);
  }

  absl::Status SetAttrs(int fd, archive_entry* e, bool dir, const std::string& rel) {
    // Owner before mode: chown clears setuid and setgid.
    if (::fchown(fd, archive_entry_uid(e), archive_entry_gid(e)) != 0) {
      return ErrnoStatus(errno, fmt::format("layer: fchown({})", rel));
    }
    if (::fchmod(fd, archive_entry_perm(e) & 07777) != 0) {
      return ErrnoStatus(errno, fmt::format("layer: fchmod({})", rel));
    }
    archive_entry_xattr_reset(e);
    const char* xname = nullptr;
    const void* value = nullptr;
    size_t size = 0;
    while (archive_entry_xattr_next(e, &xname, &value, &size) == ARCHIVE_OK) {
      std::string_view n(xname ? xname : "");
      // Only user.*, and never overlayfs' own: an opaque mark comes from .wh..wh..opq.
      if (n.rfind("user.", 0) != 0 || n.rfind("user.overlay.", 0) == 0) continue;
      if (::fsetxattr(fd, xname, value, size, 0) != 0 && errno != ENOTSUP) {
        return ErrnoStatus(errno, fmt::format("layer: fsetxattr({}, {})", rel, n));
      }
    }
    const timespec ts{archive_entry_mtime(e), archive_entry_mtime_nsec(e)};
    if (dir) {
      dir_times_.emplace_back(rel, ts);
    } else {
      timespec both[2] = {ts, ts};
      ::futimens(fd, both);
    }
    return absl::OkStatus();
  }

  absl::Status TooBig(const std::string& rel) {
    return absl::ResourceExhaustedError(fmt::format(
        "layer: unpacks to more than {} bytes (at {}): the image's limit "
        "(templates.max_image_mib) or a sparse or lying entry",
        limits_.max_bytes, rel));
  }

  static absl::Status ReadError(::archive* a, const std::string& rel) {
    const char* why = archive_error_string(a);
    return absl::InvalidArgumentError(
        fmt::format("layer: {}: {}", rel, why ? why : "the data does not read"));
  }

  int root_;
  const UnpackLimits& limits_;
  UnpackResult& res_;
  std::string parent_path_;
  UniqueFd parent_fd_;
  UniqueFd retired_;
  std::vector<std::pair<std::string, timespec>> dir_times_;
};

}  // namespace

bool IsDigest(const std::string& d) {
  if (d.size() != 71 || d.rfind("sha256:", 0) != 0) return false;
  return std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

absl::Status RemoveTree(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash + 1 == path.size()) {
    return absl::InvalidArgumentError(fmt::format("remove {}: not an absolute path", path));
  }
  const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  UniqueFd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, "open(" + parent + ")");
  return Annotate(RemoveAt(dir.get(), path.c_str() + slash + 1), "remove " + path);
}

absl::StatusOr<UnpackResult> UnpackLayer(const std::string& blob_path, const std::string& dest,
                                         const std::string& expected_diff_id,
                                         const UnpackLimits& limits, const ProgressFn& progress,
                                         const CancelFn& cancelled) {
  UniqueFd root(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root) return ErrnoStatus(errno, fmt::format("layer: open({})", dest));
  Stream s;
  s.progress = &progress;
  s.cancelled = &cancelled;
  s.max_bytes = limits.max_bytes + limits.max_entries * kPerEntryOverhead + kStreamSlack;
  ArchivePtr outer(archive_read_new());
  archive_read_support_filter_all(outer.get());
  archive_read_support_format_raw(outer.get());
  if (archive_read_open_filename(outer.get(), blob_path.c_str(), kChunk) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(fmt::format("layer: open {}: {}", blob_path,
                                                  archive_error_string(outer.get())));
  }
  s.outer = outer.get();
  archive_entry* raw = nullptr;
  if (archive_read_next_header(outer.get(), &raw) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(fmt::format("layer: {}: {}", blob_path,
                                                  archive_error_string(outer.get())));
  }
  ArchivePtr tar(archive_read_new());
  archive_read_support_format_tar(tar.get());
  archive_read_support_format_gnutar(tar.get());
  if (archive_read_open(tar.get(), &s, nullptr, ReadCb, nullptr) != ARCHIVE_OK) {
    if (!s.error.ok()) return s.error;
    return absl::InvalidArgumentError(
        fmt::format("layer: not a tar: {}", archive_error_string(tar.get())));
  }
  UnpackResult res;
  Writer w(root.get(), limits, res);
  archive_entry* e = nullptr;
  for (;;) {
    int r = archive_read_next_header(tar.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      if (!s.error.ok()) return s.error;
      return absl::InvalidArgumentError(
          fmt::format("layer: tar: {}", archive_error_string(tar.get())));
    }
    if (cancelled && cancelled()) return absl::CancelledError("layer unpack: cancelled");
    if (++res.entries > limits.max_entries) {
      return absl::ResourceExhaustedError(fmt::format(
          "layer: more than {} entries (templates.max_entries_per_layer)", limits.max_entries));
    }
    absl::Status st = w.Entry(tar.get(), e);
    if (!st.ok() && !s.error.ok()) return s.error;
    if (!st.ok()) {
      // A path the layer's own entries make impossible (through a dangling symlink, under a
      // file) is the layer's fault; a full disk or an I/O error is not.
      const bool layer_fault = absl::IsNotFound(st) || absl::IsPermissionDenied(st) ||
                               absl::IsFailedPrecondition(st) || absl::IsInvalidArgument(st);
      if (!layer_fault) return st;
      const char* name = archive_entry_pathname(e);
      return absl::InvalidArgumentError(fmt::format(
          "layer: entry \"{:.200}\": {}", name ? name : "", std::string(st.message())));
    }
  }
  // The hash covers the whole stream: what follows the tar's trailer too.
  const void* ignored = nullptr;
  for (;;) {
    la_ssize_t n = s.Read(&ignored);
    if (n < 0) return s.error;
    if (n == 0) break;
  }
  SBX_RETURN_IF_ERROR(w.Finish());
  res.diff_id = s.hash.Digest();
  if (res.diff_id != expected_diff_id) {
    return absl::DataLossError(fmt::format(
        "layer: its uncompressed content is {}, not the diff_id {} the image config names",
        res.diff_id, expected_diff_id));
  }
  return res;
}

}  // namespace sbx::image
