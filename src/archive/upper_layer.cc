#include "archive/upper_layer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "archive/tar.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::archive {
namespace {


constexpr size_t kFlushBytes = 1 << 20;

class Writer {
 public:
  Writer(uint32_t uid_base, uint32_t uid_range, const TarSink& sink,
         const std::function<bool()>& cancelled, uint64_t max_entries)
      : uid_base_(uid_base),
        uid_range_(uid_range),
        sink_(sink),
        cancelled_(cancelled),
        max_entries_(max_entries) {}

  // Depth first, with an explicit stack: the tree was made by the sandbox, and its depth must
  // not become sbxd's stack depth.
  absl::Status Walk(int root) {
    struct Frame {
      UniqueFd owned;  // empty for the root, which is the caller's
      int fd;
      std::string prefix;
      std::vector<std::string> names;
      size_t next = 0;
    };
    std::vector<Frame> stack;
    stack.push_back(Frame{UniqueFd(), root, "", {}, 0});
    SBX_ASSIGN_OR_RETURN(stack.back().names, Names(root, ""));
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next == f.names.size()) {
        stack.pop_back();
        continue;
      }
      const std::string n = f.names[f.next++];
      const int dir = f.fd;
      const std::string prefix = f.prefix;  // `f` may move when a frame is pushed
      if (cancelled_ && cancelled_()) return absl::CancelledError("build layer: cancelled");
      struct stat st {};
      if (::fstatat(dir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        return ErrnoStatus(errno, fmt::format("build layer: fstatat /{}{}", prefix, n));
      }
      TarEntry e;
      e.name = prefix + n;
      e.mode = st.st_mode & 07777;
      e.uid = Shift(st.st_uid);
      e.gid = Shift(st.st_gid);
      e.mtime = st.st_mtim.tv_sec;
      if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
        // A whiteout: the file of a lower layer is gone.
        e.name = prefix + ".wh." + n;
        e.type = TarType::kFile;
        e.mode = 0;
        SBX_RETURN_IF_ERROR(Header(e));
      } else if (S_ISDIR(st.st_mode)) {
        if (stack.size() >= static_cast<size_t>(kMaxUpperDepth)) {
          return absl::ResourceExhaustedError(fmt::format(
              "build layer: /{} is nested deeper than {} directories", e.name, kMaxUpperDepth));
        }
        UniqueFd sub(::openat(dir, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub) return ErrnoStatus(errno, fmt::format("build layer: openat /{}", e.name));
        e.type = TarType::kDirectory;
        SBX_RETURN_IF_ERROR(Header(e));
        if (Opaque(sub.get())) {
          TarEntry o;
          o.name = e.name + "/.wh..wh..opq";
          o.mode = 0;
          o.mtime = e.mtime;
          SBX_RETURN_IF_ERROR(Header(o));
        }
        const std::string sub_prefix = e.name + "/";
        SBX_ASSIGN_OR_RETURN(std::vector<std::string> names, Names(sub.get(), sub_prefix));
        const int fd = sub.get();
        stack.push_back(Frame{std::move(sub), fd, sub_prefix, std::move(names), 0});
      } else if (S_ISLNK(st.st_mode)) {
        std::string target(4096, '\0');
        ssize_t len = ::readlinkat(dir, n.c_str(), target.data(), target.size());
        if (len < 0) return ErrnoStatus(errno, fmt::format("build layer: readlinkat /{}", e.name));
        target.resize(static_cast<size_t>(len));
        e.type = TarType::kSymlink;
        e.linkname = std::move(target);
        SBX_RETURN_IF_ERROR(Header(e));
      } else if (S_ISFIFO(st.st_mode)) {
        e.type = TarType::kFifo;
        SBX_RETURN_IF_ERROR(Header(e));
      } else if (S_ISREG(st.st_mode)) {
        if (st.st_nlink > 1) {
          auto [it, first] = links_.try_emplace({st.st_dev, st.st_ino}, e.name);
          if (!first) {
            e.type = TarType::kHardLink;
            e.linkname = it->second;
            SBX_RETURN_IF_ERROR(Header(e));
            continue;
          }
        }
        SBX_RETURN_IF_ERROR(File(dir, n, st, e));
      }
      // Sockets and devices: a sandbox cannot make devices, and neither is a file's content.
    }
    return absl::OkStatus();
  }

  absl::StatusOr<UpperWalk> Finish() {
    buf_.append(TarTrailer());
    SBX_RETURN_IF_ERROR(Flush());
    UpperWalk out;
    out.tar_bytes = written_;
    out.entries = entries_;
    return out;
  }

 private:
  uint32_t Shift(uint32_t id) const {
    if (uid_base_ == 0) return id;
    return id >= uid_base_ && id - uid_base_ < uid_range_ ? id - uid_base_ : 0;
  }

  static bool Opaque(int dirfd) {
    char v[4];
    ssize_t n = ::fgetxattr(dirfd, "trusted.overlay.opaque", v, sizeof(v));
    if (n < 0) n = ::fgetxattr(dirfd, "user.overlay.opaque", v, sizeof(v));
    return n == 1 && v[0] == 'y';
  }

  // A directory's names, sorted; more than the entries left of max_entries is refused while
  // they are read (a directory of millions of names is not held first).
  absl::StatusOr<std::vector<std::string>> Names(int dir, const std::string& prefix) const {
    // A fresh description of the directory: fdopendir takes the fd, and `dir` stays ours.
    int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, fmt::format("build layer: open /{}", prefix));
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      ::close(fd);
      return ErrnoStatus(errno, fmt::format("build layer: fdopendir /{}", prefix));
    }
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* de = ::readdir(d)) {
      std::string_view n = de->d_name;
      if (n == "." || n == "..") continue;
      if (entries_ + names.size() >= max_entries_) {
        ::closedir(d);
        return TooMany();
      }
      names.emplace_back(n);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return ErrnoStatus(err, fmt::format("build layer: readdir /{}", prefix));
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status File(int dir, const std::string& n, const struct stat& st, TarEntry& e) {
    UniqueFd f(::openat(dir, n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!f) return ErrnoStatus(errno, fmt::format("build layer: openat /{}", e.name));
    e.type = TarType::kFile;
    e.size = static_cast<uint64_t>(st.st_size);
    SBX_RETURN_IF_ERROR(Header(e));
    uint64_t off = 0;
    std::string chunk(std::min<uint64_t>(e.size, kFlushBytes), '\0');
    while (off < e.size) {
      ssize_t r = ::pread(f.get(), chunk.data(), std::min<uint64_t>(chunk.size(), e.size - off),
                          static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return ErrnoStatus(errno, fmt::format("build layer: pread /{}", e.name));
      // The sandbox is frozen: a file that shrinks now was changed by something else.
      if (r == 0) {
        return absl::AbortedError(fmt::format("build layer: /{} shrank while it was read", e.name));
      }
      buf_.append(chunk.data(), static_cast<size_t>(r));
      off += static_cast<uint64_t>(r);
      if (buf_.size() >= kFlushBytes) SBX_RETURN_IF_ERROR(Flush());
    }
    buf_.append(TarPadding(e.size));
    return absl::OkStatus();
  }

  absl::Status TooMany() const {
    return absl::ResourceExhaustedError(fmt::format(
        "build layer: more than {} entries (templates.max_entries_per_layer)", max_entries_));
  }

  absl::Status Header(const TarEntry& e) {
    if (++entries_ > max_entries_) return TooMany();
    SBX_RETURN_IF_ERROR(AppendTarHeader(buf_, e));
    return buf_.size() >= kFlushBytes ? Flush() : absl::OkStatus();
  }

  absl::Status Flush() {
    if (buf_.empty()) return absl::OkStatus();
    SBX_RETURN_IF_ERROR(sink_(buf_));
    written_ += buf_.size();
    buf_.clear();
    return absl::OkStatus();
  }

  const uint32_t uid_base_;
  const uint32_t uid_range_;
  const TarSink& sink_;
  const std::function<bool()>& cancelled_;
  const uint64_t max_entries_;
  std::string buf_;
  uint64_t written_ = 0;
  uint64_t entries_ = 0;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;
};

}  // namespace

absl::StatusOr<UpperWalk> WriteUpperAsLayer(int upper_fd, uint32_t uid_base, uint32_t uid_range,
                                            const TarSink& sink,
                                            const std::function<bool()>& cancelled,
                                            uint64_t max_entries) {
  Writer w(uid_base, uid_range, sink, cancelled, max_entries);
  SBX_RETURN_IF_ERROR(w.Walk(upper_fd));
  return w.Finish();
}

}  // namespace sbx::archive
