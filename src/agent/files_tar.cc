// read_tar and write_tar: a directory as a tar stream, each way.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/files_internal.h"
#include "agent/path_resolve.h"
#include "agent/tar.h"
#include "agent/untar.h"
#include "common/unique_fd.h"

namespace sbx::agent::fileops {
namespace {

// Buffers tar bytes into kData frames of about kDataChunk.
class TarOut {
 public:
  explicit TarOut(Conn& c) : c_(c) {}
  std::string& buf() { return buf_; }
  absl::Status MaybeFlush() { return buf_.size() >= kDataChunk ? Flush() : absl::OkStatus(); }
  absl::Status Flush() {
    if (buf_.empty()) return absl::OkStatus();
    absl::Status s = c_.Send(FrameType::kData, buf_);
    buf_.clear();
    return s;
  }

 private:
  Conn& c_;
  std::string buf_;
};

absl::Status TarDir(TarOut& out, int dir, const std::string& prefix, const std::string& path,
                    int depth) {
  if (depth > kMaxTreeDepth) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "too_deep",
                    fmt::format("tar {}: deeper than {} levels", path, kMaxTreeDepth));
  }
  UniqueFd copy(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* d = copy ? ::fdopendir(copy.get()) : nullptr;
  if (!d) return FileErrnoStatus(errno, fmt::format("tar {}: opendir", path));
  copy.Release();
  std::vector<std::string> names;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::string data(kDataChunk, '\0');
  for (const std::string& n : names) {
    struct stat st {};
    if (::fstatat(dir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    TarEntry e;
    e.name = prefix + n;
    e.mode = st.st_mode & 07777;
    e.uid = st.st_uid;
    e.gid = st.st_gid;
    e.mtime = st.st_mtim.tv_sec;
    const std::string child = path == "/" ? "/" + n : path + "/" + n;
    if (S_ISDIR(st.st_mode)) {
      e.type = TarType::kDirectory;
      SBX_RETURN_IF_ERROR(AppendTarHeader(out.buf(), e));
      UniqueFd sub(::openat(dir, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) return FileErrnoStatus(errno, fmt::format("tar {}: openat", child));
      SBX_RETURN_IF_ERROR(TarDir(out, sub.get(), e.name + "/", child, depth + 1));
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t len = ::readlinkat(dir, n.c_str(), target, sizeof(target));
      if (len < 0) return FileErrnoStatus(errno, fmt::format("tar {}: readlinkat", child));
      e.type = TarType::kSymlink;
      e.linkname.assign(target, static_cast<size_t>(len));
      SBX_RETURN_IF_ERROR(AppendTarHeader(out.buf(), e));
    } else if (S_ISREG(st.st_mode)) {
      UniqueFd f(::openat(dir, n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (!f) return FileErrnoStatus(errno, fmt::format("tar {}: openat", child));
      if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
        return ApiError(absl::StatusCode::kAborted, "file_changed",
                        fmt::format("tar {}: changed while being archived", child));
      }
      e.type = TarType::kFile;
      e.size = static_cast<uint64_t>(st.st_size);
      SBX_RETURN_IF_ERROR(AppendTarHeader(out.buf(), e));
      uint64_t off = 0;
      while (off < e.size) {
        SBX_RETURN_IF_ERROR(out.MaybeFlush());
        ssize_t r = ::pread(f.get(), data.data(), std::min<uint64_t>(data.size(), e.size - off),
                            static_cast<off_t>(off));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return FileErrnoStatus(errno, fmt::format("tar {}: pread", child));
        if (r == 0) {
          return ApiError(absl::StatusCode::kAborted, "file_changed",
                          fmt::format("tar {}: shrank while being archived", child));
        }
        out.buf().append(data.data(), static_cast<size_t>(r));
        off += static_cast<uint64_t>(r);
      }
      out.buf().append(TarPadding(e.size));
    }
    // Sockets, FIFOs and devices are left out: their contents are not files.
    SBX_RETURN_IF_ERROR(out.MaybeFlush());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status OpReadTar(Conn& c, const Json& req, const FileOptions& o) {
  auto path = PathField(req, "path", o);
  if (!path.ok()) return c.SendJson(FrameType::kResponse, ErrorJson(path.status()));
  auto dir = OpenInRoot(o.root_fd, *path, O_RDONLY | O_DIRECTORY, 0, "tar");
  if (!dir.ok()) return c.SendJson(FrameType::kResponse, ErrorJson(dir.status()));
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, Json{{"ok", true}}));
  TarOut out(c);
  absl::Status s = TarDir(out, dir->get(), "", *path, 0);
  if (s.ok()) {
    out.buf().append(TarTrailer());
    s = out.Flush();
  }
  return c.SendJson(FrameType::kEnd, s.ok() ? Json{{"ok", true}} : ErrorJson(s));
}

absl::Status OpWriteTar(Conn& c, const Json& req, const FileOptions& o) {
  auto fail = [&](const absl::Status& s) {
    (void)c.SendJson(FrameType::kResponse, ErrorJson(s));
    return s;
  };
  auto path = PathField(req, "path", o);
  if (!path.ok()) return fail(path.status());
  auto max_bytes = UintField(req, "max_bytes", uint64_t{1} << 62);
  if (!max_bytes.ok()) return fail(max_bytes.status());
  if (BoolField(req, "mkdirs")) {
    if (auto s = MkdirParents(o.root_fd, *path, 0755); !s.ok()) return fail(s);
  }
  auto base = OpenInRoot(o.root_fd, *path, O_PATH | O_DIRECTORY, 0, "untar");
  if (!base.ok()) return fail(base.status());
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, Json{{"ok", true}}));
  Extractor x(base->get(), *path == "/" ? "" : *path, *max_bytes);
  auto end = [&](const absl::Status& s) {
    (void)c.SendJson(FrameType::kEnd, ErrorJson(s));
    return s;
  };
  for (;;) {
    auto f = c.Read();
    if (!f.ok()) return f.status();
    if (f->type == FrameType::kEnd) break;
    if (f->type != FrameType::kData) {
      return end(absl::InvalidArgumentError("untar: unexpected frame type"));
    }
    if (auto s = x.Feed(f->payload); !s.ok()) return end(s);
  }
  if (auto s = x.Finish(); !s.ok()) return end(s);
  return c.SendJson(FrameType::kEnd,
                    Json{{"ok", true}, {"entries", x.entries()}, {"skipped", x.skipped()}});
}

}  // namespace sbx::agent::fileops
