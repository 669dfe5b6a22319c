#include "agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "agent/files_internal.h"
#include "common/path_resolve.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "common/unique_fd.h"
#include "protocol/messages.h"

namespace sbx::agent {
namespace fileops {

Json ErrorJson(const absl::Status& s) {
  return Json{{"ok", false},
              {"error",
               {{"code", protocol::ErrorCodeName(s.code())},
                {"reason", FileErrorReason(s)},
                {"message", CutField(std::string(s.message()))}}}};
}

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

namespace {

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

}  // namespace

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

absl::StatusOr<std::vector<std::string>> DirNames(int dir, const char* op,
                                                  const std::string& path) {
  UniqueFd copy(::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* d = copy ? ::fdopendir(copy.get()) : nullptr;
  if (!d) return FileErrnoStatus(errno, fmt::format("{} {}: opendir", op, path));
  copy.Release();
  std::vector<std::string> names;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  return names;
}

}  // namespace fileops

bool IsFileOp(std::string_view op) {
  return op == "stat" || op == "list" || op == "mkdir" || op == "delete" || op == "move" ||
         op == "read" || op == "write" || op == "read_tar" || op == "write_tar" || op == "watch";
}

void ServeFileRequest(int fd, const protocol::Json& req, protocol::FrameDecoder rest,
                      const FileOptions& opts) {
  using namespace fileops;  // NOLINT(build/namespaces): the frame I/O and the ops
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
  // Every field of the request is checked by its op's typed decoder (protocol/messages.h)
  // before the op runs; a path's content is the op's to judge (ValidatePath).
  if (auto typed = protocol::RequestFromJson(req); !typed.ok()) {
    (void)c.SendJson(FrameType::kResponse, ErrorJson(typed.status()));
    return;
  }
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
