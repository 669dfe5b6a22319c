#include "agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "agent/users.h"
#include "archive/tar.h"
#include "archive/untar.h"
#include "common/path_resolve.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "common/unique_fd.h"
#include "protocol/limits.h"

namespace sbx::agent {
namespace {

using archive::AppendTarHeader;
using archive::Extractor;
using archive::MkdirParents;
using archive::TarEntry;
using archive::TarPadding;
using archive::TarTrailer;
using archive::TarType;
using archive::WriteAll;
using protocol::EncodeFrame;
using protocol::Frame;
using protocol::FrameType;
using protocol::Json;

constexpr int kMaxTreeDepth = 128;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The message is cut: it embeds paths, some of them the guest's (a name deep in a tree being
// deleted or archived), and a response or kEnd must stay under its 64 KiB bound.
Json ErrorJson(const absl::Status& s) {
  return Json{{"ok", false},
              {"error",
               {{"code", protocol::ErrorCodeName(s.code())},
                {"reason", FileErrorReason(s)},
                {"message", CutField(std::string(s.message()))}}}};
}

// ---- blocking frame I/O on the worker's connection -----------------------------------------

class Conn {
 public:
  Conn(int fd, protocol::FrameDecoder rest) : fd_(fd), decoder_(std::move(rest)) {}

  absl::Status Send(FrameType type, std::string_view payload) {
    const std::string frame = EncodeFrame(type, payload);
    size_t off = 0;
    while (off < frame.size()) {
      ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "send to host");
      }
      off += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status SendJson(FrameType type, const Json& j) { return Send(type, Dump(j)); }
  int fd() const { return fd_; }

  absl::StatusOr<Frame> Read() {
    for (;;) {
      auto next = decoder_.Next();
      if (!next.ok()) return next.status();
      if (*next) return std::move(**next);
      ssize_t n = ::recv(fd_, buf_, sizeof(buf_), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "read from host");
      }
      if (n == 0) return absl::UnavailableError("host closed the connection mid-transfer");
      decoder_.Feed(std::string_view(buf_, static_cast<size_t>(n)));
    }
  }

 private:
  int fd_;
  protocol::FrameDecoder decoder_;
  char buf_[64 * 1024];
};

// ---- request fields --------------------------------------------------------------------------

absl::StatusOr<std::string> PathField(const Json& req, const char* key, const FileOptions& o) {
  auto it = req.find(key);
  if (it == req.end() || !it->is_string()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                    fmt::format("\"{}\" must be a string", key), key);
  }
  return ValidatePath(it->get_ref<const std::string&>(), o.workdir);
}

bool BoolField(const Json& req, const char* key) {
  auto it = req.find(key);
  return it != req.end() && it->is_boolean() && it->get<bool>();
}

absl::StatusOr<std::optional<uint64_t>> UintField(const Json& req, const char* key,
                                                  uint64_t max) {
  auto it = req.find(key);
  if (it == req.end() || it->is_null()) return std::optional<uint64_t>();
  if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    fmt::format("\"{}\" must be an integer between 0 and {}", key, max), key);
  }
  return std::optional<uint64_t>(it->get<uint64_t>());
}

// ---- entries ---------------------------------------------------------------------------------

const char* TypeName(mode_t m) {
  if (S_ISREG(m)) return "file";
  if (S_ISDIR(m)) return "directory";
  if (S_ISLNK(m)) return "symlink";
  return "other";
}

std::string Mtime(const struct stat& st) {
  using namespace std::chrono;
  auto tp = system_clock::time_point(duration_cast<system_clock::duration>(
      seconds(st.st_mtim.tv_sec) + nanoseconds(st.st_mtim.tv_nsec)));
  return FormatRfc3339(tp);
}

// `dir` + `name` is what `st` describes (lstat): the symlink target is read from there.
Json EntryJson(const struct stat& st, std::string_view path, int dir, const std::string& name) {
  const size_t slash = path.rfind('/');
  Json e = {{"name", path == "/" ? std::string("/") : std::string(path.substr(slash + 1))},
            {"path", std::string(path)},
            {"type", TypeName(st.st_mode)},
            {"size", static_cast<uint64_t>(st.st_size)},
            {"mode", static_cast<unsigned>(st.st_mode & 07777)},
            {"uid", static_cast<unsigned>(st.st_uid)},
            {"gid", static_cast<unsigned>(st.st_gid)},
            {"mtime", Mtime(st)}};
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlinkat(dir, name.c_str(), target, sizeof(target));
    e["symlink_target"] = n >= 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
  }
  return e;
}

// lstat of a resolved path: the entry describes the last component itself (a symlink is
// reported as one, not followed).
absl::StatusOr<Json> StatEntry(int root_fd, const std::string& path) {
  SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenInRoot(root_fd, path, O_PATH | O_NOFOLLOW, 0, "stat"));
  struct stat st {};
  if (::fstatat(fd.get(), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    return FileErrnoStatus(errno, fmt::format("stat {}: fstatat", path));
  }
  return EntryJson(st, path, fd.get(), "");
}

// ---- ops -------------------------------------------------------------------------------------

absl::StatusOr<Json> OpStat(const Json& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, PathField(req, "path", o));
  SBX_ASSIGN_OR_RETURN(Json e, StatEntry(o.root_fd, path));
  return Json{{"ok", true}, {"entry", std::move(e)}};
}

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
    if (!out.Add(EntryJson(st, child, ::dirfd(d), n))) break;
    if (S_ISDIR(st.st_mode) && depth > 1) {
      UniqueFd sub(::openat(::dirfd(d), n.c_str(),
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub) ListDir(sub.get(), child, depth - 1, out);
    }
  }
  ::closedir(d);
}

// The payload as text (bounded.h): entries <= kMaxListEntries, bytes <= kMaxGuestReplyBytes.
absl::StatusOr<std::string> OpList(const Json& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, PathField(req, "path", o));
  SBX_ASSIGN_OR_RETURN(auto depth, UintField(req, "depth", 32));
  const int d = static_cast<int>(depth.value_or(1));
  if (d < 1) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    "depth must be at least 1", "depth");
  }
  SBX_ASSIGN_OR_RETURN(UniqueFd dir, OpenInRoot(o.root_fd, path, O_RDONLY | O_DIRECTORY, 0, "list"));
  ListReply reply("entries", protocol::kMaxListEntries);
  ListDir(dir.get(), path, d, reply);
  return reply.Finish();
}

absl::StatusOr<Json> OpMkdir(const Json& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, PathField(req, "path", o));
  SBX_ASSIGN_OR_RETURN(auto mode, UintField(req, "mode", 07777));
  const mode_t m = static_cast<mode_t>(mode.value_or(0755));
  if (BoolField(req, "parents")) {
    SBX_RETURN_IF_ERROR(MkdirParents(o.root_fd, path, m));
  } else {
    SBX_ASSIGN_OR_RETURN(ParentRef p, OpenParent(o.root_fd, path));
    if (::mkdirat(p.dir.get(), p.name.c_str(), m) != 0) {
      return FileErrnoStatus(errno, fmt::format("mkdir {}: mkdirat", path));
    }
  }
  SBX_ASSIGN_OR_RETURN(Json e, StatEntry(o.root_fd, path));
  if (e["type"] != "directory") {
    return ApiError(absl::StatusCode::kAlreadyExists, "already_exists",
                    fmt::format("mkdir {}: exists and is not a directory", path));
  }
  return Json{{"ok", true}, {"entry", std::move(e)}};
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
    UniqueFd copy(::openat(fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* d = copy ? ::fdopendir(copy.get()) : nullptr;
    if (!d) return FileErrnoStatus(errno, fmt::format("delete {}: opendir", path));
    copy.Release();
    std::vector<std::string> names;
    while (dirent* de = ::readdir(d)) {
      std::string n = de->d_name;
      if (n != "." && n != "..") names.push_back(std::move(n));
    }
    ::closedir(d);
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
      SBX_RETURN_IF_ERROR(RefuseMountPoint(ParentRef{UniqueFd(::dup(fd.get())), n},
                                           path + "/" + n, "delete"));
      SBX_RETURN_IF_ERROR(RemoveTree(fd.get(), n, path + "/" + n, depth + 1));
    }
  }
  if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return FileErrnoStatus(errno, fmt::format("delete {}: unlinkat(AT_REMOVEDIR)", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> OpDelete(const Json& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string path, PathField(req, "path", o));
  SBX_ASSIGN_OR_RETURN(ParentRef p, OpenParent(o.root_fd, path));
  // Before a recursive delete empties a mount point whose own removal then fails.
  SBX_RETURN_IF_ERROR(RefuseMountPoint(p, path, "delete"));
  if (::unlinkat(p.dir.get(), p.name.c_str(), 0) == 0) return Json{{"ok", true}};
  const int unlink_errno = errno;
  if (unlink_errno != EISDIR && unlink_errno != EPERM) {
    return FileErrnoStatus(unlink_errno, fmt::format("delete {}: unlinkat", path));
  }
  if (::unlinkat(p.dir.get(), p.name.c_str(), AT_REMOVEDIR) == 0) return Json{{"ok", true}};
  if ((errno == ENOTEMPTY || errno == EEXIST) && BoolField(req, "recursive")) {
    SBX_RETURN_IF_ERROR(RemoveTree(p.dir.get(), p.name, path, 0));
    return Json{{"ok", true}};
  }
  // EPERM from unlink is how Linux says "a directory" and also "not allowed" (sticky
  // directory, immutable file): when the entry is no directory, the EPERM was the answer.
  if (errno == ENOTDIR && unlink_errno == EPERM) {
    return FileErrnoStatus(EPERM, fmt::format("delete {}: unlinkat", path));
  }
  return FileErrnoStatus(errno == EEXIST ? ENOTEMPTY : errno,
                         fmt::format("delete {}: unlinkat(AT_REMOVEDIR)", path));
}

absl::StatusOr<Json> OpMove(const Json& req, const FileOptions& o) {
  SBX_ASSIGN_OR_RETURN(std::string from, PathField(req, "from", o));
  SBX_ASSIGN_OR_RETURN(std::string to, PathField(req, "to", o));
  if (to.size() > from.size() && to.compare(0, from.size(), from) == 0 && to[from.size()] == '/') {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                    fmt::format("move {} to {}: a directory cannot move into itself", from, to),
                    "to");
  }
  SBX_ASSIGN_OR_RETURN(ParentRef f, OpenParent(o.root_fd, from));
  SBX_ASSIGN_OR_RETURN(ParentRef t, OpenParent(o.root_fd, to));
  SBX_RETURN_IF_ERROR(RefuseMountPoint(f, from, "move"));
  const unsigned flags = BoolField(req, "overwrite") ? 0 : RENAME_NOREPLACE;
  if (::renameat2(f.dir.get(), f.name.c_str(), t.dir.get(), t.name.c_str(), flags) != 0) {
    return FileErrnoStatus(errno, fmt::format("move {} to {}: renameat2", from, to));
  }
  SBX_ASSIGN_OR_RETURN(Json e, StatEntry(o.root_fd, to));
  return Json{{"ok", true}, {"entry", std::move(e)}};
}

// read: the response, then the bytes, then kEnd. Errors before the response are returned;
// after it, they go into kEnd.
absl::Status OpRead(Conn& c, const Json& req, const FileOptions& o) {
  auto fail = [&](const absl::Status& s) {
    (void)c.SendJson(FrameType::kResponse, ErrorJson(s));
    return s;
  };
  auto path = PathField(req, "path", o);
  if (!path.ok()) return fail(path.status());
  auto offset = UintField(req, "offset", uint64_t{1} << 62);
  auto length = UintField(req, "length", uint64_t{1} << 62);
  auto suffix = UintField(req, "suffix", uint64_t{1} << 62);
  if (!offset.ok()) return fail(offset.status());
  if (!length.ok()) return fail(length.status());
  if (!suffix.ok()) return fail(suffix.status());
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  auto fd = OpenInRoot(o.root_fd, *path, O_RDONLY | O_NONBLOCK, 0, "read");
  if (!fd.ok()) return fail(fd.status());
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return fail(FileErrnoStatus(errno, "read: fstat"));
  if (S_ISDIR(st.st_mode)) return fail(FileErrnoStatus(EISDIR, fmt::format("read {}", *path)));
  if (!S_ISREG(st.st_mode)) {
    return fail(ApiError(absl::StatusCode::kFailedPrecondition, "not_a_regular_file",
                         fmt::format("read {}: not a regular file", *path)));
  }
  ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) & ~O_NONBLOCK);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t off = 0, len = size;
  bool satisfiable = true;
  if (*suffix) {
    satisfiable = **suffix > 0 && size > 0;
    len = std::min(**suffix, size);
    off = size - len;
  } else if (*offset) {
    off = **offset;
    satisfiable = off < size;
    len = satisfiable ? size - off : 0;
    if (*length) len = std::min(len, **length);
  }
  if (!satisfiable) {
    off = 0;
    len = 0;
  }
  // The entry describes what was opened (the symlink's target when the path is a symlink).
  Json e = EntryJson(st, *path, -1, "");
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, Json{{"ok", true},
                                                           {"entry", std::move(e)},
                                                           {"satisfiable", satisfiable},
                                                           {"offset", off},
                                                           {"length", len}}));
  std::string buf(kDataChunk, '\0');
  uint64_t left = len;
  while (left > 0) {
    ssize_t n = ::pread(fd->get(), buf.data(), std::min<uint64_t>(left, buf.size()),
                        static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = n < 0 ? FileErrnoStatus(errno, fmt::format("read {}: pread", *path))
                             : ApiError(absl::StatusCode::kAborted, "file_changed",
                                        fmt::format("read {}: the file shrank while being read",
                                                    *path));
      (void)c.SendJson(FrameType::kEnd, ErrorJson(s));
      return s;
    }
    SBX_RETURN_IF_ERROR(c.Send(FrameType::kData, std::string_view(buf.data(), n)));
    off += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
  }
  return c.SendJson(FrameType::kEnd, Json{{"ok", true}});
}

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

absl::Status OpWrite(Conn& c, const Json& req, const FileOptions& o) {
  auto fail = [&](const absl::Status& s) {
    (void)c.SendJson(FrameType::kResponse, ErrorJson(s));
    return s;
  };
  auto path = PathField(req, "path", o);
  if (!path.ok()) return fail(path.status());
  auto mode = UintField(req, "mode", 07777);
  auto uid = UintField(req, "uid", 0xFFFFFFFEu);
  auto gid = UintField(req, "gid", 0xFFFFFFFEu);
  auto max_bytes = UintField(req, "max_bytes", uint64_t{1} << 62);
  for (auto* f : {&mode, &uid, &gid, &max_bytes}) {
    if (!f->ok()) return fail(f->status());
  }
  std::optional<uid_t> owner_uid;
  std::optional<gid_t> owner_gid;
  if (*uid) owner_uid = static_cast<uid_t>(**uid);
  if (*gid) owner_gid = static_cast<gid_t>(**gid);
  if (auto u = req.find("user"); u != req.end() && u->is_string() && !u->get<std::string>().empty()) {
    const std::string etc = o.root_path == "/" ? "/etc" : o.root_path + "/etc";
    auto ru = ResolveUserFromFiles(u->get<std::string>(), etc + "/passwd", etc + "/group");
    if (!ru.ok()) {
      return fail(ApiError(absl::StatusCode::kInvalidArgument, "unknown_user",
                           std::string(ru.status().message()), "owner"));
    }
    owner_uid = ru->uid;
    owner_gid = ru->gid;
  }
  if (BoolField(req, "mkdirs")) {
    auto parent = SplitParent(*path);
    if (!parent.ok()) return fail(parent.status());
    if (auto s = MkdirParents(o.root_fd, parent->first, 0755); !s.ok()) return fail(s);
  }
  auto p = OpenParent(o.root_fd, *path);
  if (!p.ok()) return fail(p.status());
  struct stat existing {};
  if (::fstatat(p->dir.get(), p->name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISDIR(existing.st_mode)) {
    return fail(FileErrnoStatus(EISDIR, fmt::format("write {}", *path)));
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
    return fail(FileErrnoStatus(errno, fmt::format("write {}: create a temporary file", *path)));
  }
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, Json{{"ok", true}}));

  auto end = [&](const absl::Status& s) {
    (void)c.SendJson(FrameType::kEnd, ErrorJson(s));
    return s;
  };
  uint64_t total = 0;
  for (;;) {
    auto f = c.Read();
    if (!f.ok()) return f.status();  // the host is gone: nobody to tell
    if (f->type == FrameType::kEnd) break;
    if (f->type != FrameType::kData) {
      return end(absl::InvalidArgumentError(
          fmt::format("write {}: unexpected frame type {}", *path, static_cast<int>(f->type))));
    }
    total += f->payload.size();
    if (*max_bytes && total > **max_bytes) {
      return end(ApiError(absl::StatusCode::kResourceExhausted, "payload_too_large",
                          fmt::format("write {}: more than the sandbox's disk cap of {} bytes",
                                      *path, **max_bytes)));
    }
    if (auto s = WriteAll(tmp.fd.get(), f->payload, *path); !s.ok()) return end(s);
  }
  if (::fchmod(tmp.fd.get(), static_cast<mode_t>(mode->value_or(0644))) != 0) {
    return end(FileErrnoStatus(errno, fmt::format("write {}: fchmod", *path)));
  }
  if ((owner_uid || owner_gid) &&
      ::fchown(tmp.fd.get(), owner_uid ? *owner_uid : static_cast<uid_t>(-1),
               owner_gid ? *owner_gid : static_cast<gid_t>(-1)) != 0) {
    return end(FileErrnoStatus(errno, fmt::format("write {}: fchown", *path)));
  }
  // fsync before the rename: after a crash the name points at the whole file or the old one.
  if (::fsync(tmp.fd.get()) != 0) {
    return end(FileErrnoStatus(errno, fmt::format("write {}: fsync", *path)));
  }
  if (::renameat(p->dir.get(), tmp.name.c_str(), p->dir.get(), p->name.c_str()) != 0) {
    return end(FileErrnoStatus(errno, fmt::format("write {}: renameat", *path)));
  }
  tmp.committed = true;
  struct stat st {};
  if (::fstat(tmp.fd.get(), &st) != 0) {
    return end(FileErrnoStatus(errno, fmt::format("write {}: fstat", *path)));
  }
  return c.SendJson(FrameType::kEnd,
                    Json{{"ok", true}, {"entry", EntryJson(st, *path, -1, "")}});
}


// ---- directories as tar -----------------------------------------------------------------

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
  if (!s.ok()) {
    (void)c.SendJson(FrameType::kEnd, ErrorJson(s));
    return s;
  }
  return c.SendJson(FrameType::kEnd,
                    Json{{"ok", true}, {"entries", x.entries()}, {"skipped", x.skipped()}});
}


// ---- watch (inotify) ---------------------------------------------------------------------

constexpr size_t kMaxWatches = 8192;

class Watcher {
 public:
  Watcher(Conn& c, bool recursive) : c_(c), recursive_(recursive) {}

  absl::Status Init(int dir_fd, const std::string& path) {
    ino_.Reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!ino_) return ErrnoStatus(errno, "watch: inotify_init1");
    return Add(dir_fd, path, /*top=*/true);
  }

  // Serves events until the host goes away (EOF on the connection) or the watched directory
  // itself is deleted.
  absl::Status Run() {
    std::vector<char> buf(64 * 1024);
    for (;;) {
      pollfd fds[2] = {{ino_.get(), POLLIN, 0}, {c_.fd(), POLLIN | POLLRDHUP, 0}};
      int n = ::poll(fds, 2, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "watch: poll");
      }
      // The host sends nothing after the request: anything readable is EOF or an error.
      if (fds[1].revents) return absl::OkStatus();
      if (!(fds[0].revents & POLLIN)) continue;
      ssize_t len = ::read(ino_.get(), buf.data(), buf.size());
      if (len < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoStatus(errno, "watch: read inotify");
      }
      std::map<uint32_t, std::pair<std::string, bool>> moved_from;  // cookie -> path, is_dir
      for (ssize_t off = 0; off < len;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf.data() + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->mask & IN_Q_OVERFLOW) {
          SBX_RETURN_IF_ERROR(Emit(Json{{"type", "overflow"}, {"path", top_}, {"is_dir", true}}));
          continue;
        }
        auto it = dirs_.find(ev->wd);
        if (it == dirs_.end()) continue;
        if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
          if (it->second.path == top_) return absl::OkStatus();  // nothing left to watch
          continue;
        }
        if (ev->mask & IN_IGNORED) {
          dirs_.erase(it);
          continue;
        }
        const std::string name = ev->len ? std::string(ev->name) : std::string();
        const std::string path =
            name.empty() ? it->second.path
                         : (it->second.path == "/" ? "/" + name : it->second.path + "/" + name);
        const bool is_dir = ev->mask & IN_ISDIR;
        if (ev->mask & IN_CREATE) {
          if (is_dir && recursive_) AddChild(it->second.fd.get(), name, path);
          SBX_RETURN_IF_ERROR(Emit(Event("create", path, is_dir)));
        } else if (ev->mask & IN_CLOSE_WRITE) {
          SBX_RETURN_IF_ERROR(Emit(Event("modify", path, is_dir)));
        } else if (ev->mask & IN_DELETE) {
          SBX_RETURN_IF_ERROR(Emit(Event("delete", path, is_dir)));
        } else if (ev->mask & IN_MOVED_FROM) {
          moved_from[ev->cookie] = {path, is_dir};
        } else if (ev->mask & IN_MOVED_TO) {
          if (is_dir && recursive_) AddChild(it->second.fd.get(), name, path);
          auto from = moved_from.find(ev->cookie);
          Json e = Event(from != moved_from.end() ? "move" : "create", path, is_dir);
          if (from != moved_from.end()) {
            e["from"] = from->second.first;
            moved_from.erase(from);
          }
          SBX_RETURN_IF_ERROR(Emit(e));
        }
      }
      // Moved out of the watched tree (no matching IN_MOVED_TO): gone from here.
      for (const auto& [cookie, pd] : moved_from) {
        SBX_RETURN_IF_ERROR(Emit(Event("delete", pd.first, pd.second)));
      }
    }
  }

 private:
  struct Dir {
    std::string path;
    UniqueFd fd;  // O_PATH, for the subdirectories created later
  };

  static Json Event(const char* type, const std::string& path, bool is_dir) {
    return Json{{"type", type}, {"path", path}, {"is_dir", is_dir}};
  }
  absl::Status Emit(const Json& e) { return c_.SendJson(FrameType::kData, e); }

  absl::Status Add(int dir_fd, const std::string& path, bool top) {
    if (dirs_.size() >= kMaxWatches) return absl::OkStatus();  // the rest goes unwatched
    // The resolved directory through its fd, so that nothing is looked up by name again.
    const std::string proc = fmt::format("/proc/self/fd/{}", dir_fd);
    const uint32_t mask = IN_CREATE | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                          IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;
    int wd = ::inotify_add_watch(ino_.get(), proc.c_str(), mask);
    if (wd < 0) {
      if (!top) return absl::OkStatus();  // a subdirectory that vanished or cannot be watched
      return FileErrnoStatus(errno, fmt::format("watch {}: inotify_add_watch", path));
    }
    if (top) top_ = path;
    UniqueFd own(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
    if (recursive_) {
      UniqueFd rd(::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      DIR* d = rd ? ::fdopendir(rd.get()) : nullptr;
      if (d) {
        rd.Release();
        std::vector<std::string> subdirs;
        while (dirent* de = ::readdir(d)) {
          const std::string n = de->d_name;
          // No more than can still be watched: a guest's directory may hold millions.
          if (dirs_.size() + subdirs.size() >= kMaxWatches) break;
          if (n != "." && n != ".." && de->d_type == DT_DIR) subdirs.push_back(n);
        }
        ::closedir(d);
        dirs_[wd] = Dir{path, std::move(own)};
        for (const std::string& n : subdirs) {
          AddChild(dirs_[wd].fd.get(), n, path == "/" ? "/" + n : path + "/" + n);
        }
        return absl::OkStatus();
      }
    }
    dirs_[wd] = Dir{path, std::move(own)};
    return absl::OkStatus();
  }

  void AddChild(int parent_fd, const std::string& name, const std::string& path) {
    // A guest can nest directories far past PATH_MAX (openat chains). Below kMaxPathBytes
    // every event path (a watched path, '/', a name of <= 255 bytes) stays under
    // kMaxFieldBytes and each kData event far under its frame bound; the watches' paths then
    // hold at most kMaxWatches * kMaxPathBytes, and the recursion through Add() ends there.
    if (path.size() > kMaxPathBytes) return;
    UniqueFd sub(::openat(parent_fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub) (void)Add(sub.get(), path, false);
  }

  Conn& c_;
  bool recursive_;
  UniqueFd ino_;
  std::string top_;
  std::map<int, Dir> dirs_;  // by watch descriptor
};

absl::Status OpWatch(Conn& c, const Json& req, const FileOptions& o) {
  auto path = PathField(req, "path", o);
  if (!path.ok()) return c.SendJson(FrameType::kResponse, ErrorJson(path.status()));
  auto dir = OpenInRoot(o.root_fd, *path, O_PATH | O_DIRECTORY, 0, "watch");
  if (!dir.ok()) return c.SendJson(FrameType::kResponse, ErrorJson(dir.status()));
  Watcher w(c, BoolField(req, "recursive"));
  if (auto s = w.Init(dir->get(), *path); !s.ok()) {
    return c.SendJson(FrameType::kResponse, ErrorJson(s));
  }
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, Json{{"ok", true}}));
  absl::Status s = w.Run();
  (void)c.SendJson(FrameType::kEnd, s.ok() ? Json{{"ok", true}} : ErrorJson(s));
  return s;
}

}  // namespace

bool IsFileOp(std::string_view op) {
  return op == "stat" || op == "list" || op == "mkdir" || op == "delete" || op == "move" ||
         op == "read" || op == "write" || op == "read_tar" || op == "write_tar" || op == "watch";
}

void ServeFileRequest(int fd, const Json& req, protocol::FrameDecoder rest,
                      const FileOptions& opts) {
  timeval tv{};
  tv.tv_sec = kFileIoTimeout.count();
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  Conn c(fd, std::move(rest));
  if (!c.SendJson(FrameType::kHello, Json{{"version", protocol::kVersion}, {"role", "agent"}})
           .ok()) {
    return;
  }
  const std::string op = req.value("op", "");
  try {
    if (op == "read") {
      (void)OpRead(c, req, opts);
      return;
    }
    if (op == "write") {
      (void)OpWrite(c, req, opts);
      return;
    }
    if (op == "read_tar") {
      (void)OpReadTar(c, req, opts);
      return;
    }
    if (op == "write_tar") {
      (void)OpWriteTar(c, req, opts);
      return;
    }
    if (op == "watch") {
      (void)OpWatch(c, req, opts);
      return;
    }
    if (op == "list") {
      absl::StatusOr<std::string> r = OpList(req, opts);
      (void)(r.ok() ? c.Send(FrameType::kResponse, *r)
                    : c.SendJson(FrameType::kResponse, ErrorJson(r.status())));
      return;
    }
    absl::StatusOr<Json> r = absl::InvalidArgumentError(fmt::format("unknown op \"{}\"", op));
    if (op == "stat") r = OpStat(req, opts);
    if (op == "mkdir") r = OpMkdir(req, opts);
    if (op == "delete") r = OpDelete(req, opts);
    if (op == "move") r = OpMove(req, opts);
    (void)c.SendJson(FrameType::kResponse, r.ok() ? *r : ErrorJson(r.status()));
  } catch (const std::exception& e) {
    (void)c.SendJson(FrameType::kResponse,
                     ErrorJson(absl::InternalError(fmt::format("{}: {}", op, e.what()))));
  }
}

}  // namespace sbx::agent
