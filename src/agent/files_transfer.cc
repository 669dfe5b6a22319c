// read and write: a file's bytes as kData frames, each way.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "agent/files_internal.h"
#include "common/path_resolve.h"
#include "archive/untar.h"  // MkdirParents
#include "agent/users.h"
#include "common/unique_fd.h"

namespace sbx::agent::fileops {

using archive::MkdirParents;
using archive::WriteAll;
namespace {

std::string RandomHex() {
  unsigned char b[8] = {};
  if (::getrandom(b, sizeof(b), 0) != sizeof(b)) {
    // Uniqueness is what matters (O_EXCL checks it): fall back to pid and clock.
    const uint64_t v = static_cast<uint64_t>(::getpid()) << 32 ^
                       static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::memcpy(b, &v, sizeof(b));
  }
  return fmt::format("{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3],
                     b[4], b[5], b[6], b[7]);
}

// A temporary file in the target's directory, removed unless Commit()ed.
class TempFile {
 public:
  ~TempFile() {
    if (fd && !committed) ::unlinkat(dir, name.c_str(), 0);
  }
  int dir = -1;
  std::string name;
  UniqueFd fd;
  bool committed = false;
};

// An upload's frames, read off the host's socket by the op itself: a kData payload goes from
// the socket into the file with splice(2) through a pipe, so the agent neither copies it into
// its memory nor through the frame decoder (which copied each byte twice more: issue 15's
// upload profile), or with recv + write where splice is refused.
class UploadReader {
 public:
  explicit UploadReader(Conn& c) : fd_(c.fd()), pending_(c.TakeBuffered()) {}

  absl::StatusOr<std::pair<FrameType, uint32_t>> Header() {
    uint8_t h[protocol::kHeaderSize];
    SBX_RETURN_IF_ERROR(ReadExact(reinterpret_cast<char*>(h), sizeof(h)));
    return protocol::DecodeHeader(h);
  }

  absl::Status Skip(uint32_t n) {
    char sink[256];
    while (n > 0) {
      const size_t k = std::min<size_t>(n, sizeof(sink));
      SBX_RETURN_IF_ERROR(ReadExact(sink, k));
      n -= static_cast<uint32_t>(k);
    }
    return absl::OkStatus();
  }

  // The next `n` bytes from the host into `out`; errors writing `out` name `path`.
  absl::Status CopyTo(int out, uint32_t n, const std::string& path) {
    const size_t early = std::min<size_t>(n, pending_.size() - pos_);
    if (early > 0) {
      SBX_RETURN_IF_ERROR(WriteAll(out, std::string_view(pending_).substr(pos_, early), path));
      pos_ += early;
      n -= static_cast<uint32_t>(early);
    }
    while (n > 0) {
      if (!no_splice_ && !pipe_w_) OpenPipe();
      if (no_splice_) {
        if (!buf_) buf_ = std::make_unique_for_overwrite<char[]>(kBufBytes);
        const ssize_t k = ::recv(fd_, buf_.get(), std::min<size_t>(n, kBufBytes), 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ErrnoStatus(errno, "read from host");
        if (k == 0) return absl::UnavailableError("host closed the connection mid-transfer");
        SBX_RETURN_IF_ERROR(WriteAll(out, std::string_view(buf_.get(), static_cast<size_t>(k)), path));
        n -= static_cast<uint32_t>(k);
        continue;
      }
      ssize_t k = ::splice(fd_, nullptr, pipe_w_.get(), nullptr, n, SPLICE_F_MOVE);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && errno == EINVAL && !spliced_) {
        no_splice_ = true;  // a socket or file system without splice support
        continue;
      }
      if (k < 0) return ErrnoStatus(errno, "read from host: splice");
      if (k == 0) return absl::UnavailableError("host closed the connection mid-transfer");
      spliced_ = true;
      n -= static_cast<uint32_t>(k);
      while (k > 0) {
        const ssize_t m = ::splice(pipe_r_.get(), nullptr, out, nullptr, static_cast<size_t>(k),
                                   SPLICE_F_MOVE);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0) {
          return FileErrnoStatus(m < 0 ? errno : EIO, fmt::format("write {}: splice", path));
        }
        k -= m;
      }
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kBufBytes = 256 << 10;

  absl::Status ReadExact(char* out, size_t n) {
    const size_t early = std::min(n, pending_.size() - pos_);
    std::memcpy(out, pending_.data() + pos_, early);
    pos_ += early;
    for (size_t got = early; got < n;) {
      const ssize_t k = ::recv(fd_, out + got, n - got, MSG_WAITALL);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) return ErrnoStatus(errno, "read from host");
      if (k == 0) return absl::UnavailableError("host closed the connection mid-transfer");
      got += static_cast<size_t>(k);
    }
    return absl::OkStatus();
  }

  void OpenPipe() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      no_splice_ = true;
      return;
    }
    pipe_r_.Reset(p[0]);
    pipe_w_.Reset(p[1]);
    // A 1 MiB pipe: a quarter of the splice calls of the default 64 KiB. Best effort (the
    // agent may be past its user's pipe-pages limit); the default size works as well.
    (void)::fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
  }

  int fd_;
  std::string pending_;
  size_t pos_ = 0;
  UniqueFd pipe_r_, pipe_w_;
  bool no_splice_ = false;
  bool spliced_ = false;
  std::unique_ptr<char[]> buf_;
};

}  // namespace

absl::Status OpRead(Conn& c, const protocol::ReadRequest& req, const FileOptions& o) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  auto opened = OpenPath(req.path, o, O_RDONLY | O_NONBLOCK, "read");
  if (!opened.ok()) return c.Fail(kResponse, opened.status());
  const std::string& path = opened->path;
  const int fd = opened->fd.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return c.Fail(kResponse, FileErrnoStatus(errno, "read: fstat"));
  }
  if (S_ISDIR(st.st_mode)) {
    return c.Fail(kResponse, FileErrnoStatus(EISDIR, fmt::format("read {}", path)));
  }
  if (!S_ISREG(st.st_mode)) {
    return c.Fail(kResponse, ApiError(absl::StatusCode::kFailedPrecondition, "not_a_regular_file",
                                      fmt::format("read {}: not a regular file", path)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t off = 0, len = size;
  bool satisfiable = true;
  if (req.suffix) {
    satisfiable = *req.suffix > 0 && size > 0;
    len = std::min(*req.suffix, size);
    off = size - len;
  } else if (req.offset) {
    off = *req.offset;
    satisfiable = off < size;
    len = satisfiable ? size - off : 0;
    if (req.length) len = std::min(len, *req.length);
  }
  if (!satisfiable) {
    off = 0;
    len = 0;
  }
  // The entry describes what was opened (the symlink's target when the path is a symlink).
  const protocol::ReadReply reply{EntryOf(st, path, -1, ""), satisfiable, off, len};
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, reply.ToJson()));
  std::string buf(kDataChunk, '\0');
  uint64_t left = len;
  while (left > 0) {
    ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(left, buf.size()),
                        static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = n < 0 ? FileErrnoStatus(errno, fmt::format("read {}: pread", path))
                             : ApiError(absl::StatusCode::kAborted, "file_changed",
                                        fmt::format("read {}: the file shrank while being read",
                                                    path));
      return c.Fail(kEnd, s);
    }
    SBX_RETURN_IF_ERROR(c.Send(FrameType::kData, std::string_view(buf.data(), n)));
    off += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
  }
  return c.SendJson(FrameType::kEnd, protocol::OkReply{}.ToJson());
}

absl::StatusOr<Owner> UserOwner(const std::optional<std::string>& user, const FileOptions& o) {
  Owner out;
  if (user && !user->empty()) {
    const std::string etc = o.root_path == "/" ? "/etc" : o.root_path + "/etc";
    auto ru = ResolveUserFromFiles(*user, etc + "/passwd", etc + "/group");
    if (!ru.ok()) {
      return ApiError(absl::StatusCode::kInvalidArgument, "unknown_user",
                      std::string(ru.status().message()), "owner");
    }
    out.uid = ru->uid;
    out.gid = ru->gid;
  }
  return out;
}

absl::StatusOr<Owner> RequestOwner(const protocol::WriteRequest& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(Owner out, UserOwner(req.user, o));
  if (req.user && !req.user->empty()) return out;
  if (req.uid) out.uid = static_cast<uid_t>(*req.uid);
  if (req.gid) out.gid = static_cast<gid_t>(*req.gid);
  return out;
}

std::optional<std::pair<uid_t, gid_t>> DirOwner(const Owner& owner) {
  if (!owner.uid && !owner.gid) return std::nullopt;
  return std::make_pair(owner.uid ? *owner.uid : static_cast<uid_t>(-1),
                        owner.gid ? *owner.gid : static_cast<gid_t>(-1));
}

absl::Status OpWrite(Conn& c, const protocol::WriteRequest& req, const FileOptions& o) {
  auto path = ValidatePath(req.path, o.workdir);
  if (!path.ok()) return c.Fail(kResponse, path.status());
  auto owner = RequestOwner(req, o);
  if (!owner.ok()) return c.Fail(kResponse, owner.status());
  const std::optional<uid_t> owner_uid = owner->uid;
  const std::optional<gid_t> owner_gid = owner->gid;
  if (req.mkdirs) {
    auto parent = SplitParent(*path);
    if (!parent.ok()) return c.Fail(kResponse, parent.status());
    absl::Status made = MkdirParents(o.root_fd, parent->first, 0755, DirOwner(*owner));
    if (!made.ok()) return c.Fail(kResponse, made);
  }
  auto p = OpenParent(o.root_fd, *path);
  if (!p.ok()) return c.Fail(kResponse, p.status());
  struct stat existing {};
  if (::fstatat(p->dir.get(), p->name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISDIR(existing.st_mode)) {
    return c.Fail(kResponse, FileErrnoStatus(EISDIR, fmt::format("write {}", *path)));
  }
  TempFile tmp;
  tmp.dir = p->dir.get();
  for (int attempt = 0; attempt < 8 && !tmp.fd; ++attempt) {
    tmp.name = ".sbx-upload-" + RandomHex();
    tmp.fd.Reset(::openat(p->dir.get(), tmp.name.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!tmp.fd && errno != EEXIST) break;
  }
  if (!tmp.fd) {
    return c.Fail(kResponse,
                  FileErrnoStatus(errno, fmt::format("write {}: create a temporary file", *path)));
  }
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, protocol::OkReply{}.ToJson()));

  uint64_t total = 0;
  UploadReader in(c);
  for (;;) {
    auto h = in.Header();
    if (!h.ok()) return h.status();  // the host is gone: nobody to tell
    const auto [type, length] = *h;
    if (type == FrameType::kEnd) {
      SBX_RETURN_IF_ERROR(in.Skip(length));
      break;
    }
    if (type != FrameType::kData) {
      return c.Fail(kEnd, absl::InvalidArgumentError(fmt::format(
                              "write {}: unexpected frame type {}", *path,
                              static_cast<int>(type))));
    }
    total += length;
    if (req.max_bytes && total > *req.max_bytes) {
      return c.Fail(kEnd, ApiError(absl::StatusCode::kResourceExhausted, "payload_too_large",
                                   fmt::format("write {}: more than the sandbox's disk cap of "
                                               "{} bytes",
                                               *path, *req.max_bytes)));
    }
    if (auto s = in.CopyTo(tmp.fd.get(), length, *path); !s.ok()) return c.Fail(kEnd, s);
  }
  if (::fchmod(tmp.fd.get(), static_cast<mode_t>(req.mode.value_or(0644))) != 0) {
    return c.Fail(kEnd, FileErrnoStatus(errno, fmt::format("write {}: fchmod", *path)));
  }
  if ((owner_uid || owner_gid) &&
      ::fchown(tmp.fd.get(), owner_uid ? *owner_uid : static_cast<uid_t>(-1),
               owner_gid ? *owner_gid : static_cast<gid_t>(-1)) != 0) {
    return c.Fail(kEnd, FileErrnoStatus(errno, fmt::format("write {}: fchown", *path)));
  }
  // fsync before the rename: after a crash the name points at the whole file or the old one.
  if (::fsync(tmp.fd.get()) != 0) {
    return c.Fail(kEnd, FileErrnoStatus(errno, fmt::format("write {}: fsync", *path)));
  }
  if (::renameat(p->dir.get(), tmp.name.c_str(), p->dir.get(), p->name.c_str()) != 0) {
    return c.Fail(kEnd, FileErrnoStatus(errno, fmt::format("write {}: renameat", *path)));
  }
  tmp.committed = true;
  struct stat st {};
  if (::fstat(tmp.fd.get(), &st) != 0) {
    return c.Fail(kEnd, FileErrnoStatus(errno, fmt::format("write {}: fstat", *path)));
  }
  return c.SendJson(FrameType::kEnd, protocol::EntryReply{EntryOf(st, *path, -1, "")}.ToJson());
}

}  // namespace sbx::agent::fileops
