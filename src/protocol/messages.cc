#include "protocol/messages.h"

#include <signal.h>

#include <fmt/format.h>

#include "common/status_util.h"
#include "protocol/guest_reply.h"

namespace sbx::protocol {
namespace {

// Typed, non-throwing reads of one object's fields; every error names `what` and the field.
// Absent and null are the same ("not given") for optional fields.
class Reader {
 public:
  Reader(const Json& j, std::string_view what) : j_(j), what_(what) {}

  absl::Status Error(std::string_view key, std::string_view must) const {
    return absl::InvalidArgumentError(
        fmt::format("{}: field \"{}\" must be {}", what_, key, must));
  }
  const Json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  absl::StatusOr<std::string> String(const char* key) const {
    const Json* v = Find(key);
    if (v == nullptr || !v->is_string()) return Error(key, "a string");
    return v->get<std::string>();
  }
  absl::StatusOr<std::optional<std::string>> OptString(const char* key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Error(key, "a string");
    return std::optional<std::string>(v->get<std::string>());
  }
  absl::StatusOr<bool> Bool(const char* key) const {
    SBX_ASSIGN_OR_RETURN(std::optional<bool> b, OptBool(key));
    return b.value_or(false);
  }
  absl::StatusOr<std::optional<bool>> OptBool(const char* key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return Error(key, "a boolean");
    return std::optional<bool>(v->get<bool>());
  }
  absl::StatusOr<std::optional<uint64_t>> OptU64(const char* key, uint64_t min,
                                                 uint64_t max) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<uint64_t>();
    // nlohmann stores non-negative integers parsed from text as unsigned.
    if (!v->is_number_unsigned() || v->get<uint64_t>() < min || v->get<uint64_t>() > max) {
      return Error(key, fmt::format("an integer from {} to {}", min, max));
    }
    return std::optional<uint64_t>(v->get<uint64_t>());
  }
  absl::StatusOr<uint64_t> U64(const char* key, uint64_t max = UINT64_MAX) const {
    SBX_ASSIGN_OR_RETURN(std::optional<uint64_t> n, OptU64(key, 0, max));
    if (!n) return Error(key, "a non-negative integer");
    return *n;
  }
  absl::StatusOr<std::optional<int64_t>> OptInt(const char* key) const {
    const Json* v = Find(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer()) return Error(key, "an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(key, "an integer in range");
    }
    return std::optional<int64_t>(v->get<int64_t>());
  }
  // A session id: what the agent keys its sessions by.
  absl::StatusOr<std::string> SessionId() const {
    SBX_ASSIGN_OR_RETURN(std::string id, String("session_id"));
    if (id.empty() || id.size() > kMaxSessionIdLength) {
      return Error("session_id", fmt::format("a string of 1 to {} bytes", kMaxSessionIdLength));
    }
    return id;
  }

 private:
  const Json& j_;
  std::string_view what_;
};

bool HasNul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

Json Op(std::string_view op) { return Json{{"op", std::string(op)}}; }

Json OkJson() { return Json{{"ok", true}}; }

absl::StatusOr<TtySize> TtyFromJson(const Json& t) {
  TtySize size;
  if (t.is_boolean()) return size;  // true: the default size (false is checked by the caller)
  if (!t.is_object()) {
    return absl::InvalidArgumentError(
        "spec: field \"tty\" must be a boolean or {\"rows\",\"cols\"}");
  }
  Reader r(t, "spec.tty");
  SBX_ASSIGN_OR_RETURN(auto rows, r.OptU64("rows", 1, 65535));
  SBX_ASSIGN_OR_RETURN(auto cols, r.OptU64("cols", 1, 65535));
  if (rows) size.rows = static_cast<uint16_t>(*rows);
  if (cols) size.cols = static_cast<uint16_t>(*cols);
  return size;
}

absl::StatusOr<std::map<std::string, std::string>> EnvFromJson(const Json& e) {
  std::map<std::string, std::string> env;
  if (!e.is_object()) return absl::InvalidArgumentError("spec: field \"env\" must be an object");
  for (const auto& [k, v] : e.items()) {
    if (k.empty() || k.find('=') != std::string::npos || HasNul(k) || !v.is_string() ||
        HasNul(v.get_ref<const std::string&>())) {
      return absl::InvalidArgumentError(fmt::format(
          "spec: field \"env\" entry \"{}\": keys must be non-empty without '=' and values "
          "strings, neither with NUL bytes",
          k));
    }
    env[k] = v.get<std::string>();
  }
  return env;
}

}  // namespace

std::string DumpJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// ---- spec -----------------------------------------------------------------------------------

Json SessionSpec::ToJson() const {
  Json j = {{"argv", argv}, {"cwd", cwd}, {"env", env}, {"user", user}};
  if (tty) j["tty"] = Json{{"rows", tty->rows}, {"cols", tty->cols}};
  if (stdin_pipe) j["stdin"] = true;
  if (timeout_s) j["timeout_s"] = *timeout_s;
  if (kill_grace_s) j["kill_grace_s"] = *kill_grace_s;
  return j;
}

absl::StatusOr<SessionSpec> SessionSpec::FromJson(const Json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("spec must be an object");
  Reader r(j, "spec");
  SessionSpec s;
  const Json* argv = r.Find("argv");
  if (argv == nullptr || !argv->is_array() || argv->empty()) {
    return r.Error("argv", "a non-empty array of strings");
  }
  for (const auto& a : *argv) {
    if (!a.is_string() || HasNul(a.get_ref<const std::string&>())) {
      return r.Error("argv", "an array of strings without NUL bytes");
    }
    s.argv.push_back(a.get<std::string>());
  }
  if (s.argv[0].empty()) return r.Error("argv", "an array whose first string is not empty");
  SBX_ASSIGN_OR_RETURN(auto cwd, r.OptString("cwd"));
  if (cwd && HasNul(*cwd)) return r.Error("cwd", "a string without NUL bytes");
  s.cwd = cwd.value_or("");
  if (const Json* e = r.Find("env")) {
    SBX_ASSIGN_OR_RETURN(s.env, EnvFromJson(*e));
  }
  SBX_ASSIGN_OR_RETURN(auto user, r.OptString("user"));
  s.user = user.value_or("");
  if (const Json* t = r.Find("tty"); t != nullptr && !(t->is_boolean() && !t->get<bool>())) {
    SBX_ASSIGN_OR_RETURN(s.tty, TtyFromJson(*t));
  }
  SBX_ASSIGN_OR_RETURN(s.stdin_pipe, r.Bool("stdin"));
  SBX_ASSIGN_OR_RETURN(s.timeout_s, r.OptU64("timeout_s", 1, kMaxTimeoutS));
  SBX_ASSIGN_OR_RETURN(s.kill_grace_s, r.OptU64("kill_grace_s", 0, kMaxKillGraceS));
  return s;
}

// ---- requests -------------------------------------------------------------------------------

Json PingRequest::ToJson() const { return Op(kOp); }
absl::StatusOr<PingRequest> PingRequest::FromJson(const Json&) { return PingRequest{}; }

Json AttachRequest::ToJson() const {
  Json j = Op(kOp);
  j["session_id"] = session_id;
  j["after_event_id"] = after_event_id;
  if (spec) j["spec"] = spec->ToJson();
  return j;
}

absl::StatusOr<AttachRequest> AttachRequest::FromJson(const Json& j) {
  Reader r(j, "attach request");
  AttachRequest a;
  SBX_ASSIGN_OR_RETURN(a.session_id, r.SessionId());
  SBX_ASSIGN_OR_RETURN(auto after, r.OptU64("after_event_id", 0, UINT64_MAX));
  a.after_event_id = after.value_or(0);
  if (const Json* spec = r.Find("spec")) {
    SBX_ASSIGN_OR_RETURN(a.spec, SessionSpec::FromJson(*spec));
  }
  return a;
}

Json StatusRequest::ToJson() const {
  Json j = Op(kOp);
  j["session_id"] = session_id;
  return j;
}

absl::StatusOr<StatusRequest> StatusRequest::FromJson(const Json& j) {
  StatusRequest s;
  SBX_ASSIGN_OR_RETURN(s.session_id, Reader(j, "status request").String("session_id"));
  return s;
}

Json SignalRequest::ToJson() const {
  Json j = Op(kOp);
  j["session_id"] = session_id;
  j["signal"] = signal;
  return j;
}

absl::StatusOr<SignalRequest> SignalRequest::FromJson(const Json& j) {
  Reader r(j, "signal request");
  SignalRequest s;
  SBX_ASSIGN_OR_RETURN(s.session_id, r.String("session_id"));
  const Json* sig = r.Find("signal");
  if (sig != nullptr && sig->is_number_integer()) {
    const int64_t v = sig->is_number_unsigned() && sig->get<uint64_t>() > INT64_MAX
                          ? 0
                          : sig->get<int64_t>();
    if (v >= 1 && v <= SIGRTMAX) s.signal = static_cast<int>(v);
  } else if (sig != nullptr && sig->is_string()) {
    s.signal = SignalNumber(sig->get<std::string>()).value_or(0);
  }
  if (s.signal == 0) return r.Error("signal", "a signal number (1-64) or name");
  return s;
}

Json StdinRequest::ToJson() const {
  Json j = Op(kOp);
  j["session_id"] = session_id;
  j["data_b64"] = data_b64;
  return j;
}

absl::StatusOr<StdinRequest> StdinRequest::FromJson(const Json& j) {
  Reader r(j, "stdin request");
  StdinRequest s;
  SBX_ASSIGN_OR_RETURN(s.session_id, r.String("session_id"));
  SBX_ASSIGN_OR_RETURN(s.data_b64, r.String("data_b64"));
  return s;
}

Json StdinCloseRequest::ToJson() const {
  Json j = Op(kOp);
  j["session_id"] = session_id;
  return j;
}

absl::StatusOr<StdinCloseRequest> StdinCloseRequest::FromJson(const Json& j) {
  StdinCloseRequest s;
  SBX_ASSIGN_OR_RETURN(s.session_id, Reader(j, "stdin_close request").String("session_id"));
  return s;
}

Json ResizeRequest::ToJson() const {
  Json j = Op(kOp);
  j["session_id"] = session_id;
  j["rows"] = rows;
  j["cols"] = cols;
  return j;
}

absl::StatusOr<ResizeRequest> ResizeRequest::FromJson(const Json& j) {
  Reader r(j, "resize request");
  ResizeRequest s;
  SBX_ASSIGN_OR_RETURN(s.session_id, r.String("session_id"));
  SBX_ASSIGN_OR_RETURN(auto rows, r.OptU64("rows", 1, 65535));
  SBX_ASSIGN_OR_RETURN(auto cols, r.OptU64("cols", 1, 65535));
  if (!rows) return r.Error("rows", "an integer from 1 to 65535");
  if (!cols) return r.Error("cols", "an integer from 1 to 65535");
  s.rows = static_cast<uint16_t>(*rows);
  s.cols = static_cast<uint16_t>(*cols);
  return s;
}

Json ProcessesRequest::ToJson() const { return Op(kOp); }
absl::StatusOr<ProcessesRequest> ProcessesRequest::FromJson(const Json&) {
  return ProcessesRequest{};
}

Json StatRequest::ToJson() const {
  Json j = Op(kOp);
  j["path"] = path;
  return j;
}

absl::StatusOr<StatRequest> StatRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "stat request";
  StatRequest s;
  SBX_ASSIGN_OR_RETURN(s.path, Reader(j, kWhat).String("path"));
  return s;
}

Json ListRequest::ToJson() const {
  Json j = Op(kOp);
  j["path"] = path;
  if (depth) j["depth"] = *depth;
  return j;
}

absl::StatusOr<ListRequest> ListRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "list request";
  Reader r(j, kWhat);
  ListRequest s;
  SBX_ASSIGN_OR_RETURN(s.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(s.depth, r.OptU64("depth", 0, 32));
  return s;
}

Json MkdirRequest::ToJson() const {
  Json j = Op(kOp);
  j["path"] = path;
  j["parents"] = parents;
  if (mode) j["mode"] = *mode;
  if (user) j["user"] = *user;
  return j;
}

absl::StatusOr<MkdirRequest> MkdirRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "mkdir request";
  Reader r(j, kWhat);
  MkdirRequest s;
  SBX_ASSIGN_OR_RETURN(s.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(s.parents, r.Bool("parents"));
  SBX_ASSIGN_OR_RETURN(s.mode, r.OptU64("mode", 0, 07777));
  SBX_ASSIGN_OR_RETURN(s.user, r.OptString("user"));
  return s;
}

Json DeleteRequest::ToJson() const {
  Json j = Op(kOp);
  j["path"] = path;
  j["recursive"] = recursive;
  return j;
}

absl::StatusOr<DeleteRequest> DeleteRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "delete request";
  Reader r(j, kWhat);
  DeleteRequest s;
  SBX_ASSIGN_OR_RETURN(s.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(s.recursive, r.Bool("recursive"));
  return s;
}

Json MoveRequest::ToJson() const {
  Json j = Op(kOp);
  j["from"] = from;
  j["to"] = to;
  j["overwrite"] = overwrite;
  return j;
}

absl::StatusOr<MoveRequest> MoveRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "move request";
  Reader r(j, kWhat);
  MoveRequest s;
  SBX_ASSIGN_OR_RETURN(s.from, r.String("from"));
  SBX_ASSIGN_OR_RETURN(s.to, r.String("to"));
  SBX_ASSIGN_OR_RETURN(s.overwrite, r.Bool("overwrite"));
  return s;
}

Json ReadRequest::ToJson() const {
  Json j = Op(tar ? kTarOp : kOp);
  j["path"] = path;
  if (offset) j["offset"] = *offset;
  if (length) j["length"] = *length;
  if (suffix) j["suffix"] = *suffix;
  return j;
}

absl::StatusOr<ReadRequest> ReadRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "read request";
  Reader r(j, kWhat);
  ReadRequest s;
  s.tar = j.is_object() && j.value("op", Json()) == Json(kTarOp);
  SBX_ASSIGN_OR_RETURN(s.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(s.offset, r.OptU64("offset", 0, kMaxFileOffset));
  SBX_ASSIGN_OR_RETURN(s.length, r.OptU64("length", 0, kMaxFileOffset));
  SBX_ASSIGN_OR_RETURN(s.suffix, r.OptU64("suffix", 0, kMaxFileOffset));
  return s;
}

Json WriteRequest::ToJson() const {
  Json j = Op(tar ? kTarOp : kOp);
  j["path"] = path;
  if (mode) j["mode"] = *mode;
  if (uid) j["uid"] = *uid;
  if (gid) j["gid"] = *gid;
  if (user) j["user"] = *user;
  j["mkdirs"] = mkdirs;
  if (max_bytes) j["max_bytes"] = *max_bytes;
  return j;
}

absl::StatusOr<WriteRequest> WriteRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "write request";
  Reader r(j, kWhat);
  WriteRequest s;
  s.tar = j.is_object() && j.value("op", Json()) == Json(kTarOp);
  SBX_ASSIGN_OR_RETURN(s.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(s.mode, r.OptU64("mode", 0, 07777));
  SBX_ASSIGN_OR_RETURN(s.uid, r.OptU64("uid", 0, 0xFFFFFFFEu));
  SBX_ASSIGN_OR_RETURN(s.gid, r.OptU64("gid", 0, 0xFFFFFFFEu));
  SBX_ASSIGN_OR_RETURN(s.user, r.OptString("user"));
  SBX_ASSIGN_OR_RETURN(s.mkdirs, r.Bool("mkdirs"));
  SBX_ASSIGN_OR_RETURN(s.max_bytes, r.OptU64("max_bytes", 0, kMaxFileOffset));
  return s;
}

Json WatchRequest::ToJson() const {
  Json j = Op(kOp);
  j["path"] = path;
  j["recursive"] = recursive;
  return j;
}

absl::StatusOr<WatchRequest> WatchRequest::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "watch request";
  Reader r(j, kWhat);
  WatchRequest s;
  SBX_ASSIGN_OR_RETURN(s.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(s.recursive, r.Bool("recursive"));
  return s;
}

Json ExportLayerRequest::ToJson() const {
  Json j = Op(kOp);
  j["max_entries"] = max_entries;
  return j;
}

absl::StatusOr<ExportLayerRequest> ExportLayerRequest::FromJson(const Json& j) {
  Reader r(j, "export_layer request");
  ExportLayerRequest e;
  SBX_ASSIGN_OR_RETURN(auto max, r.OptU64("max_entries", 1, UINT64_MAX));
  e.max_entries = max.value_or(UINT64_MAX);
  return e;
}

namespace {

template <typename T>
absl::StatusOr<Request> As(const Json& j) {
  SBX_ASSIGN_OR_RETURN(T t, T::FromJson(j));
  return Request(std::move(t));
}

using FromJsonFn = absl::StatusOr<Request> (*)(const Json&);
struct OpEntry {
  std::string_view op;
  FromJsonFn decode;
};
constexpr OpEntry kOps[] = {
    {PingRequest::kOp, As<PingRequest>},
    {AttachRequest::kOp, As<AttachRequest>},
    {StatusRequest::kOp, As<StatusRequest>},
    {SignalRequest::kOp, As<SignalRequest>},
    {StdinRequest::kOp, As<StdinRequest>},
    {StdinCloseRequest::kOp, As<StdinCloseRequest>},
    {ResizeRequest::kOp, As<ResizeRequest>},
    {ProcessesRequest::kOp, As<ProcessesRequest>},
    {StatRequest::kOp, As<StatRequest>},
    {ListRequest::kOp, As<ListRequest>},
    {MkdirRequest::kOp, As<MkdirRequest>},
    {DeleteRequest::kOp, As<DeleteRequest>},
    {MoveRequest::kOp, As<MoveRequest>},
    {ReadRequest::kOp, As<ReadRequest>},
    {ReadRequest::kTarOp, As<ReadRequest>},
    {WriteRequest::kOp, As<WriteRequest>},
    {WriteRequest::kTarOp, As<WriteRequest>},
    {WatchRequest::kOp, As<WatchRequest>},
    {ExportLayerRequest::kOp, As<ExportLayerRequest>},
};

}  // namespace

absl::StatusOr<Request> RequestFromJson(const Json& j) {
  auto op = j.is_object() ? j.find("op") : j.end();
  if (!j.is_object() || op == j.end() || !op->is_string()) {
    return absl::InvalidArgumentError("request has no string \"op\"");
  }
  const std::string& name = op->get_ref<const std::string&>();
  for (const OpEntry& e : kOps) {
    if (e.op == name) return e.decode(j);
  }
  return absl::UnimplementedError(fmt::format("unknown op \"{}\"", name));
}

absl::StatusOr<Request> DecodeRequest(std::string_view payload) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObjectPayload(payload, "request"));
  return RequestFromJson(j);
}

std::string_view OpOf(const Request& r) {
  return std::visit(
      [](const auto& req) -> std::string_view {
        using T = std::decay_t<decltype(req)>;
        if constexpr (std::is_same_v<T, ReadRequest> || std::is_same_v<T, WriteRequest>) {
          return req.tar ? T::kTarOp : T::kOp;
        } else {
          return T::kOp;
        }
      },
      r);
}

// ---- replies --------------------------------------------------------------------------------

Json PingReply::ToJson() const { return OkJson(); }
absl::StatusOr<PingReply> PingReply::FromJson(const Json&) { return PingReply{}; }

Json OkReply::ToJson() const { return OkJson(); }
absl::StatusOr<OkReply> OkReply::FromJson(const Json&) { return OkReply{}; }

Json AttachReply::ToJson() const {
  Json j = OkJson();
  j["started"] = started;
  j["pid"] = pid;
  return j;
}

absl::StatusOr<AttachReply> AttachReply::FromJson(const Json& j) {
  Reader r(j, "attach reply");
  AttachReply a;
  SBX_ASSIGN_OR_RETURN(a.started, r.Bool("started"));
  SBX_ASSIGN_OR_RETURN(auto pid, r.OptInt("pid"));
  a.pid = pid.value_or(0);
  return a;
}

Json StatusReply::ToJson() const {
  auto opt = [](const auto& v) { return v ? Json(*v) : Json(nullptr); };
  Json j = OkJson();
  j["state"] = state;
  j["pid"] = opt(pid);
  j["exit_code"] = opt(exit_code);
  j["signal"] = opt(signal);
  j["started_at"] = opt(started_at);
  j["exited_at"] = opt(exited_at);
  j["oom_killed"] = oom_killed;
  j["timed_out"] = timed_out;
  if (tty) j["tty"] = *tty;
  if (stdin_pipe) j["stdin"] = *stdin_pipe;
  return j;
}

absl::StatusOr<StatusReply> StatusReply::FromJson(const Json& j) {
  Reader r(j, "status reply");
  StatusReply s;
  SBX_ASSIGN_OR_RETURN(s.state, r.String("state"));
  SBX_ASSIGN_OR_RETURN(s.pid, r.OptInt("pid"));
  SBX_ASSIGN_OR_RETURN(auto code, r.OptInt("exit_code"));
  if (code && (*code < INT32_MIN || *code > INT32_MAX)) {
    return r.Error("exit_code", "a 32-bit integer");
  }
  if (code) s.exit_code = static_cast<int>(*code);
  SBX_ASSIGN_OR_RETURN(s.signal, r.OptString("signal"));
  SBX_ASSIGN_OR_RETURN(s.started_at, r.OptString("started_at"));
  SBX_ASSIGN_OR_RETURN(s.exited_at, r.OptString("exited_at"));
  SBX_ASSIGN_OR_RETURN(s.oom_killed, r.Bool("oom_killed"));
  SBX_ASSIGN_OR_RETURN(s.timed_out, r.Bool("timed_out"));
  SBX_ASSIGN_OR_RETURN(s.tty, r.OptBool("tty"));
  SBX_ASSIGN_OR_RETURN(s.stdin_pipe, r.OptBool("stdin"));
  return s;
}

Json QueuedReply::ToJson() const {
  Json j = OkJson();
  j["queued"] = queued;
  return j;
}

absl::StatusOr<QueuedReply> QueuedReply::FromJson(const Json& j) {
  QueuedReply q;
  SBX_ASSIGN_OR_RETURN(auto n, Reader(j, "stdin reply").OptU64("queued", 0, UINT64_MAX));
  q.queued = n.value_or(0);
  return q;
}

Json FileEntry::ToJson() const {
  Json j = {{"name", name}, {"path", path}, {"type", type},   {"size", size},
            {"mode", mode}, {"uid", uid},   {"gid", gid},     {"mtime", mtime}};
  if (symlink_target) j["symlink_target"] = *symlink_target;
  return j;
}

absl::StatusOr<FileEntry> FileEntry::FromJson(const Json& j, std::string_view what) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: field \"entry\" must be an object", what));
  }
  const std::string where = fmt::format("{} entry", what);
  Reader r(j, where);
  FileEntry e;
  SBX_ASSIGN_OR_RETURN(e.name, r.String("name"));
  SBX_ASSIGN_OR_RETURN(e.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(e.type, r.String("type"));
  SBX_ASSIGN_OR_RETURN(e.size, r.U64("size"));
  SBX_ASSIGN_OR_RETURN(e.mode, r.U64("mode", 07777));
  SBX_ASSIGN_OR_RETURN(e.uid, r.U64("uid", UINT32_MAX));
  SBX_ASSIGN_OR_RETURN(e.gid, r.U64("gid", UINT32_MAX));
  SBX_ASSIGN_OR_RETURN(e.mtime, r.String("mtime"));
  SBX_ASSIGN_OR_RETURN(e.symlink_target, r.OptString("symlink_target"));
  return e;
}

namespace {
absl::StatusOr<FileEntry> EntryField(const Json& j, std::string_view what) {
  auto it = j.find("entry");
  if (it == j.end()) {
    return absl::InvalidArgumentError(fmt::format("{}: missing field \"entry\"", what));
  }
  return FileEntry::FromJson(*it, what);
}
}  // namespace

Json EntryReply::ToJson() const {
  Json j = OkJson();
  j["entry"] = entry.ToJson();
  return j;
}

absl::StatusOr<EntryReply> EntryReply::FromJson(const Json& j) {
  EntryReply e;
  SBX_ASSIGN_OR_RETURN(e.entry, EntryField(j, "file reply"));
  return e;
}

Json ReadReply::ToJson() const {
  Json j = OkJson();
  j["entry"] = entry.ToJson();
  j["satisfiable"] = satisfiable;
  j["offset"] = offset;
  j["length"] = length;
  return j;
}

absl::StatusOr<ReadReply> ReadReply::FromJson(const Json& j) {
  constexpr std::string_view kWhat = "read reply";
  Reader r(j, kWhat);
  ReadReply out;
  // "read_tar" answers a bare {"ok":true}: no entry, no range.
  if (j.contains("entry")) {
    SBX_ASSIGN_OR_RETURN(out.entry, EntryField(j, kWhat));
  }
  SBX_ASSIGN_OR_RETURN(auto satisfiable, r.OptBool("satisfiable"));
  out.satisfiable = satisfiable.value_or(true);
  SBX_ASSIGN_OR_RETURN(auto offset, r.OptU64("offset", 0, UINT64_MAX));
  SBX_ASSIGN_OR_RETURN(auto length, r.OptU64("length", 0, UINT64_MAX));
  out.offset = offset.value_or(0);
  out.length = length.value_or(0);
  return out;
}

Json WriteTarEnd::ToJson() const {
  Json j = OkJson();
  j["entries"] = entries;
  j["skipped"] = skipped;
  return j;
}

absl::StatusOr<WriteTarEnd> WriteTarEnd::FromJson(const Json& j) {
  Reader r(j, "write_tar end");
  WriteTarEnd w;
  SBX_ASSIGN_OR_RETURN(w.entries, r.U64("entries"));
  SBX_ASSIGN_OR_RETURN(auto skipped, r.OptU64("skipped", 0, UINT64_MAX));
  w.skipped = skipped.value_or(0);
  return w;
}

Json ExportLayerEnd::ToJson() const {
  Json j = OkJson();
  j["entries"] = entries;
  j["tar_bytes"] = tar_bytes;
  return j;
}

absl::StatusOr<ExportLayerEnd> ExportLayerEnd::FromJson(const Json& j) {
  Reader r(j, "export_layer end");
  ExportLayerEnd e;
  SBX_ASSIGN_OR_RETURN(e.entries, r.U64("entries"));
  SBX_ASSIGN_OR_RETURN(e.tar_bytes, r.U64("tar_bytes"));
  return e;
}

Json WatchEvent::ToJson() const {
  Json j = {{"type", type}, {"path", path}, {"is_dir", is_dir}};
  if (from) j["from"] = *from;
  return j;
}

absl::StatusOr<WatchEvent> WatchEvent::FromJson(const Json& j) {
  Reader r(j, "watch event");
  WatchEvent e;
  SBX_ASSIGN_OR_RETURN(e.type, r.String("type"));
  SBX_ASSIGN_OR_RETURN(e.path, r.String("path"));
  SBX_ASSIGN_OR_RETURN(e.is_dir, r.Bool("is_dir"));
  SBX_ASSIGN_OR_RETURN(e.from, r.OptString("from"));
  return e;
}

absl::StatusOr<WatchEvent> DecodeWatchEvent(std::string_view payload) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObjectPayload(payload, "watch event"));
  return WatchEvent::FromJson(j);
}

Json ErrorReply::ToJson() const {
  Json err = {{"code", code}, {"message", message}};
  if (reason) err["reason"] = *reason;
  return Json{{"ok", false}, {"error", std::move(err)}};
}

ErrorReply ErrorReply::FromStatus(const absl::Status& s, std::optional<std::string> reason) {
  ErrorReply e;
  e.code = ErrorCodeName(s.code());
  e.message = std::string(s.message());
  e.reason = std::move(reason);
  return e;
}

absl::Status ErrorReply::ToStatus() const {
  return AgentErrorFromFields(code, message, reason.value_or(""));
}

ErrorReply ErrorReply::FromJson(const Json& j) {
  ErrorReply e;
  e.code.clear();
  auto err = j.is_object() ? j.find("error") : j.end();
  if (j.is_object() && err != j.end() && err->is_object()) {
    e.code = StringField(*err, "code");
    e.message = StringField(*err, "message");
    if (err->contains("reason")) e.reason = StringField(*err, "reason");
  }
  return e;
}

absl::Status BadReply(std::string_view what, const absl::Status& cause) {
  return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                  fmt::format("agent protocol: {}: {}", what, std::string(cause.message())));
}

absl::Status CheckReplyOk(const Json& j, std::string_view what) {
  auto ok = j.find("ok");
  (void)what;
  // Anything but "ok": true is the agent's error, read leniently (as sbxd always has).
  if (ok == j.end() || !ok->is_boolean() || !ok->get<bool>()) {
    return ErrorReply::FromJson(j).ToStatus();
  }
  return absl::OkStatus();
}

}  // namespace sbx::protocol
