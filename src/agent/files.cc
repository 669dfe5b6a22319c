#include "agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <variant>
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
  protocol::ErrorReply e = protocol::ErrorReply::FromStatus(s, FileErrorReason(s));
  e.message = CutField(e.message);
  return e.ToJson();
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
protocol::FileEntry EntryOf(const struct stat& st, std::string_view path, int dir,
                            const std::string& name) {
  const size_t slash = path.rfind('/');
  protocol::FileEntry e;
  e.name = path == "/" ? std::string("/") : std::string(path.substr(slash + 1));
  e.path = std::string(path);
  e.type = TypeName(st.st_mode);
  e.size = static_cast<uint64_t>(st.st_size);
  e.mode = st.st_mode & 07777;
  e.uid = st.st_uid;
  e.gid = st.st_gid;
  e.mtime = Mtime(st);
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlinkat(dir, name.c_str(), target, sizeof(target));
    e.symlink_target = n >= 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
  }
  return e;
}

// lstat of a resolved path: the entry describes the last component itself (a symlink is
// reported as one, not followed).
absl::StatusOr<protocol::FileEntry> StatEntry(int root_fd, const std::string& path) {
  SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenInRoot(root_fd, path, O_PATH | O_NOFOLLOW, 0, "stat"));
  struct stat st {};
  if (::fstatat(fd.get(), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    return FileErrnoStatus(errno, fmt::format("stat {}: fstatat", path));
  }
  return EntryOf(st, path, fd.get(), "");
}

absl::StatusOr<OpenedPath> OpenPath(const std::string& raw, const FileOptions& o, int flags,
                                    std::string_view what) {
  SBX_ASSIGN_OR_RETURN(std::string path, ValidatePath(raw, o.workdir));
  SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenInRoot(o.root_fd, path, flags, 0, what));
  return OpenedPath{std::move(path), std::move(fd)};
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

namespace {

using protocol::Json;

// What the agent's own field readers checked before the typed protocol, per op and in their
// order: the paths (their type, then ValidatePath), then the numbers; and the fields they read
// leniently. The typed decoder (protocol/messages.h) is the one parser. For a request it
// refuses, these give the answer the agent always gave (code, reason and message: sbxd and the
// tests compare them; a path is judged before any other field), and what those readers let
// through still goes through: a boolean of another type was false, a "user" that is no string
// was no user, and read_tar and write_tar never read the fields of read and write they do not
// use. Requests sbxd encodes never get here: it is the decoder's failure path only.
struct BoundedUint {
  const char* key;
  uint64_t max;
};
struct OldFields {
  std::string_view op;
  std::vector<const char*> paths;
  std::vector<BoundedUint> uints;
  std::vector<const char*> bools;
  bool user = false;  // "user", a string
};

const OldFields* OldFieldsOf(std::string_view op) {
  using protocol::kMaxFileOffset;
  static const OldFields kOld[] = {
      {"stat", {"path"}, {}, {}},
      {"list", {"path"}, {{"depth", 32}}, {}},
      {"mkdir", {"path"}, {{"mode", 07777}}, {"parents"}},
      {"delete", {"path"}, {}, {"recursive"}},
      {"move", {"from", "to"}, {}, {"overwrite"}},
      {"read",
       {"path"},
       {{"offset", kMaxFileOffset}, {"length", kMaxFileOffset}, {"suffix", kMaxFileOffset}},
       {}},
      {"read_tar", {"path"}, {}, {}},
      {"write",
       {"path"},
       {{"mode", 07777}, {"uid", 0xFFFFFFFEu}, {"gid", 0xFFFFFFFEu}, {"max_bytes", kMaxFileOffset}},
       {"mkdirs"},
       true},
      {"write_tar", {"path"}, {{"max_bytes", kMaxFileOffset}}, {"mkdirs"}},
      {"watch", {"path"}, {}, {"recursive"}},
      {"export_layer", {}, {{"max_entries", UINT64_MAX}}, {}},
  };
  for (const OldFields& f : kOld) {
    if (f.op == op) return &f;
  }
  return nullptr;
}

absl::Status OldFieldError(const Json& req, const OldFields& f, const FileOptions& o) {
  for (const char* key : f.paths) {
    auto it = req.find(key);
    if (it == req.end() || !it->is_string()) {
      return ApiError(absl::StatusCode::kInvalidArgument, "invalid_path",
                      fmt::format("\"{}\" must be a string", key), key);
    }
    SBX_RETURN_IF_ERROR(ValidatePath(it->get_ref<const std::string&>(), o.workdir).status());
  }
  for (const BoundedUint& u : f.uints) {
    auto it = req.find(u.key);
    if (it == req.end() || it->is_null()) continue;
    if (!it->is_number_unsigned() || it->get<uint64_t>() > u.max) {
      return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                      fmt::format("\"{}\" must be an integer between 0 and {}", u.key, u.max),
                      u.key);
    }
  }
  return absl::OkStatus();
}

// `req` with only what the old readers took from it, as they took it (see OldFields).
Json OldFieldsOnly(const Json& req, const OldFields& f) {
  Json out = Json::object();
  out["op"] = std::string(f.op);
  auto copy = [&](const char* key, bool (Json::*is)() const noexcept) {
    auto it = req.find(key);
    if (it != req.end() && ((*it).*is)()) out[key] = *it;
  };
  for (const char* key : f.paths) copy(key, &Json::is_string);
  for (const BoundedUint& u : f.uints) copy(u.key, &Json::is_number_unsigned);
  for (const char* key : f.bools) copy(key, &Json::is_boolean);
  if (f.user) copy("user", &Json::is_string);
  return out;
}

// The request as its op's type, decoded once; a refusal is what the agent always answered.
absl::StatusOr<protocol::Request> DecodeFileRequest(const Json& req, const FileOptions& o) {
  auto typed = protocol::RequestFromJson(req);
  if (typed.ok()) return typed;
  const OldFields* f = OldFieldsOf(req.value("op", ""));
  if (f == nullptr) return typed.status();
  SBX_RETURN_IF_ERROR(OldFieldError(req, *f, o));
  return protocol::RequestFromJson(OldFieldsOnly(req, *f));
}

}  // namespace

bool IsFileOp(std::string_view op) { return OldFieldsOf(op) != nullptr; }

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
  absl::StatusOr<protocol::Request> typed = DecodeFileRequest(req, opts);
  if (!typed.ok()) {
    (void)c.Fail(kResponse, typed.status());
    return;
  }
  try {
    if (const auto* r = std::get_if<protocol::ReadRequest>(&*typed)) {
      (void)(r->tar ? OpReadTar(c, *r, opts) : OpRead(c, *r, opts));
      return;
    }
    if (const auto* w = std::get_if<protocol::WriteRequest>(&*typed)) {
      (void)(w->tar ? OpWriteTar(c, *w, opts) : OpWrite(c, *w, opts));
      return;
    }
    if (const auto* w = std::get_if<protocol::WatchRequest>(&*typed)) {
      (void)OpWatch(c, *w, opts);
      return;
    }
    if (const auto* e = std::get_if<protocol::ExportLayerRequest>(&*typed)) {
      (void)OpExportLayer(c, *e, opts);
      return;
    }
    if (const auto* l = std::get_if<protocol::ListRequest>(&*typed)) {
      absl::StatusOr<std::string> r = OpList(*l, opts);
      (void)(r.ok() ? c.Send(kResponse, *r) : c.Fail(kResponse, r.status()));
      return;
    }
    absl::StatusOr<Json> r = absl::InvalidArgumentError(fmt::format("unknown op \"{}\"", op));
    if (const auto* s = std::get_if<protocol::StatRequest>(&*typed)) r = OpStat(*s, opts);
    if (const auto* m = std::get_if<protocol::MkdirRequest>(&*typed)) r = OpMkdir(*m, opts);
    if (const auto* d = std::get_if<protocol::DeleteRequest>(&*typed)) r = OpDelete(*d, opts);
    if (const auto* m = std::get_if<protocol::MoveRequest>(&*typed)) r = OpMove(*m, opts);
    (void)c.SendJson(kResponse, r.ok() ? *r : ErrorJson(r.status()));
  } catch (const std::exception& e) {
    (void)c.Fail(kResponse, absl::InternalError(fmt::format("{}: {}", op, e.what())));
  }
}

}  // namespace sbx::agent
