// read_tar and write_tar: a directory as a tar stream, each way.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/files_internal.h"
#include "common/path_resolve.h"
#include "archive/tar.h"
#include "archive/untar.h"
#include "common/unique_fd.h"

namespace sbx::agent::fileops {
namespace {

using archive::AppendTarHeader;
using archive::Extractor;
using archive::MkdirParents;
using archive::TarEntry;
using archive::TarPadding;
using archive::TarTrailer;
using archive::TarType;

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
  SBX_ASSIGN_OR_RETURN(std::vector<std::string> names, DirNames(dir, "tar", path));
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

absl::Status OpReadTar(Conn& c, const protocol::ReadRequest& req, const FileOptions& o) {
  auto dir = OpenPath(req.path, o, O_RDONLY | O_DIRECTORY, "tar");
  if (!dir.ok()) return c.Fail(kResponse, dir.status());
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, protocol::OkReply{}.ToJson()));
  TarOut out(c);
  absl::Status s = TarDir(out, dir->fd.get(), "", dir->path, 0);
  if (s.ok()) {
    out.buf().append(TarTrailer());
    s = out.Flush();
  }
  return c.SendJson(FrameType::kEnd, s.ok() ? protocol::OkReply{}.ToJson() : ErrorJson(s));
}

absl::Status OpWriteTar(Conn& c, const protocol::WriteRequest& req, const FileOptions& o) {
  auto path = ValidatePath(req.path, o.workdir);
  if (!path.ok()) return c.Fail(kResponse, path.status());
  if (req.mkdirs) {
    if (auto s = MkdirParents(o.root_fd, *path, 0755); !s.ok()) return c.Fail(kResponse, s);
  }
  auto owner = RequestOwner(req, o);
  if (!owner.ok()) return c.Fail(kResponse, owner.status());
  auto base = OpenInRoot(o.root_fd, *path, O_PATH | O_DIRECTORY, 0, "untar");
  if (!base.ok()) return c.Fail(kResponse, base.status());
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, protocol::OkReply{}.ToJson()));
  Extractor x(base->get(), *path == "/" ? "" : *path, req.max_bytes);
  if (owner->uid || owner->gid) {
    x.SetOwner(owner->uid.value_or(::geteuid()), owner->gid.value_or(::getegid()));
  }
  bool conn_failed = false;
  Frame frame;  // holds the piece the extractor is reading
  absl::Status s = x.Run([&]() -> absl::StatusOr<std::string_view> {
    auto f = c.Read();
    if (!f.ok()) {
      conn_failed = true;
      return f.status();
    }
    if (f->type == FrameType::kEnd) return std::string_view();
    if (f->type != FrameType::kData) return absl::InvalidArgumentError("untar: unexpected frame type");
    frame = std::move(*f);
    return std::string_view(frame.payload);
  });
  if (conn_failed) return s;
  if (!s.ok()) return c.Fail(kEnd, s);
  const protocol::WriteTarEnd done{static_cast<uint64_t>(x.entries()),
                                   static_cast<uint64_t>(x.skipped())};
  return c.SendJson(FrameType::kEnd, done.ToJson());
}

}  // namespace sbx::agent::fileops
