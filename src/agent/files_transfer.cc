// read and write: a file's bytes as kData frames, each way.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

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

absl::Status OpWrite(Conn& c, const protocol::WriteRequest& req, const FileOptions& o) {
  auto path = ValidatePath(req.path, o.workdir);
  if (!path.ok()) return c.Fail(kResponse, path.status());
  std::optional<uid_t> owner_uid;
  std::optional<gid_t> owner_gid;
  if (req.uid) owner_uid = static_cast<uid_t>(*req.uid);
  if (req.gid) owner_gid = static_cast<gid_t>(*req.gid);
  if (req.user && !req.user->empty()) {
    const std::string etc = o.root_path == "/" ? "/etc" : o.root_path + "/etc";
    auto ru = ResolveUserFromFiles(*req.user, etc + "/passwd", etc + "/group");
    if (!ru.ok()) {
      return c.Fail(kResponse, ApiError(absl::StatusCode::kInvalidArgument, "unknown_user",
                                        std::string(ru.status().message()), "owner"));
    }
    owner_uid = ru->uid;
    owner_gid = ru->gid;
  }
  if (req.mkdirs) {
    auto parent = SplitParent(*path);
    if (!parent.ok()) return c.Fail(kResponse, parent.status());
    absl::Status made = MkdirParents(o.root_fd, parent->first, 0755);
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
  for (;;) {
    auto f = c.Read();
    if (!f.ok()) return f.status();  // the host is gone: nobody to tell
    if (f->type == FrameType::kEnd) break;
    if (f->type != FrameType::kData) {
      return c.Fail(kEnd, absl::InvalidArgumentError(fmt::format(
                              "write {}: unexpected frame type {}", *path,
                              static_cast<int>(f->type))));
    }
    total += f->payload.size();
    if (req.max_bytes && total > *req.max_bytes) {
      return c.Fail(kEnd, ApiError(absl::StatusCode::kResourceExhausted, "payload_too_large",
                                   fmt::format("write {}: more than the sandbox's disk cap of "
                                               "{} bytes",
                                               *path, *req.max_bytes)));
    }
    if (auto s = WriteAll(tmp.fd.get(), f->payload, *path); !s.ok()) return c.Fail(kEnd, s);
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
