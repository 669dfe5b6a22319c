// Every request and reply of the agent protocol (protocol.h documents the wire) as a C++ type:
// the one schema both sides compile against. sbxd encodes requests and decodes replies
// (service/agent_client.h), the agent decodes requests and encodes replies, so a field's name,
// type and bounds live here and nowhere else.
//
// Encoding keeps the wire bytes of the untyped code this replaced: a JSON object with the
// same fields (nlohmann orders an object's keys, so field order is the same too). Decoding
// never throws and never trusts the other side: a field of the wrong type or out of range is
// InvalidArgument naming the field ("status reply: field \"pid\" must be ..."). A path is
// checked for its type only: what it may name is the agent's path resolution
// (common/path_resolve.h), which gives the specific reasons ("invalid_path", ...). The
// guest-sized replies ("processes", "list") have no tree type on purpose: sbxd reads them with
// the SAX rewrite of protocol/guest_reply.h.
//
// The agent links this statically with libc, absl, fmt and nlohmann only: nothing here may
// need OpenSSL or Boost (hence "data_b64" stays base64 text in StdinRequest).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "protocol/protocol.h"

namespace sbx::protocol {

// The compact dump used on the wire; invalid UTF-8 is replaced, never thrown about.
std::string DumpJson(const Json& j);

// ---- the session spec ---------------------------------------------------------------------

inline constexpr uint64_t kMaxTimeoutS = 30ull * 86400;
inline constexpr uint64_t kMaxKillGraceS = 300;
inline constexpr uint64_t kDefaultKillGraceS = 5;
inline constexpr size_t kMaxSessionIdLength = 256;

struct TtySize {
  uint16_t rows = 24;
  uint16_t cols = 80;
  bool operator==(const TtySize&) const = default;
};

// What the first attach of a session starts. Encoded as {"argv","cwd","env","user"} plus the
// interactive fields only when set, so a plain session's spec is what it always was.
struct SessionSpec {
  std::vector<std::string> argv;          // non-empty, argv[0] non-empty, no NUL bytes
  std::string cwd;                        // "" = "/"
  std::map<std::string, std::string> env; // keys non-empty without '='; no NUL bytes
  std::string user;                       // "" = the agent's own user
  std::optional<TtySize> tty;             // decoded from true (24x80) or {"rows","cols"}
  bool stdin_pipe = false;                // "stdin"
  std::optional<uint64_t> timeout_s;      // 1..kMaxTimeoutS
  std::optional<uint64_t> kill_grace_s;   // 0..kMaxKillGraceS
  bool operator==(const SessionSpec&) const = default;

  Json ToJson() const;
  // InvalidArgument "spec.<field> ..." for what the agent cannot start.
  static absl::StatusOr<SessionSpec> FromJson(const Json& j);
};

// ---- requests -----------------------------------------------------------------------------
// Each has kOp, ToJson() (with "op") and FromJson() (of a parsed request object).

struct PingRequest {
  static constexpr std::string_view kOp = "ping";
  Json ToJson() const;
  static absl::StatusOr<PingRequest> FromJson(const Json& j);
};

struct AttachRequest {
  static constexpr std::string_view kOp = "attach";
  std::string session_id;        // 1..kMaxSessionIdLength bytes
  uint64_t after_event_id = 0;
  std::optional<SessionSpec> spec;  // required by the first attach only
  Json ToJson() const;
  static absl::StatusOr<AttachRequest> FromJson(const Json& j);
};

struct StatusRequest {
  static constexpr std::string_view kOp = "status";
  std::string session_id;
  Json ToJson() const;
  static absl::StatusOr<StatusRequest> FromJson(const Json& j);
};

struct SignalRequest {
  static constexpr std::string_view kOp = "signal";
  std::string session_id;
  int signal = 0;  // on the wire a number, or a name ("TERM", "SIGTERM") that decodes to one
  Json ToJson() const;
  static absl::StatusOr<SignalRequest> FromJson(const Json& j);
};

struct StdinRequest {
  static constexpr std::string_view kOp = "stdin";
  std::string session_id;
  std::string data_b64;  // checked as base64 by the agent, which decodes it
  Json ToJson() const;
  static absl::StatusOr<StdinRequest> FromJson(const Json& j);
};

struct StdinCloseRequest {
  static constexpr std::string_view kOp = "stdin_close";
  std::string session_id;
  Json ToJson() const;
  static absl::StatusOr<StdinCloseRequest> FromJson(const Json& j);
};

struct ResizeRequest {
  static constexpr std::string_view kOp = "resize";
  std::string session_id;
  uint16_t rows = 0;  // 1..65535
  uint16_t cols = 0;
  Json ToJson() const;
  static absl::StatusOr<ResizeRequest> FromJson(const Json& j);
};

struct ProcessesRequest {
  static constexpr std::string_view kOp = "processes";
  Json ToJson() const;
  static absl::StatusOr<ProcessesRequest> FromJson(const Json& j);
};

struct StatRequest {
  static constexpr std::string_view kOp = "stat";
  std::string path;
  Json ToJson() const;
  static absl::StatusOr<StatRequest> FromJson(const Json& j);
};

struct ListRequest {
  static constexpr std::string_view kOp = "list";
  std::string path;
  std::optional<uint64_t> depth;  // 1..32 (the agent's default: 1)
  Json ToJson() const;
  static absl::StatusOr<ListRequest> FromJson(const Json& j);
};

struct MkdirRequest {
  static constexpr std::string_view kOp = "mkdir";
  std::string path;
  bool parents = false;
  std::optional<uint64_t> mode;  // permission bits, <= 07777
  // Owner of every directory it makes, as WriteRequest::user; unset: the agent (root).
  std::optional<std::string> user;
  Json ToJson() const;
  static absl::StatusOr<MkdirRequest> FromJson(const Json& j);
};

struct DeleteRequest {
  static constexpr std::string_view kOp = "delete";
  std::string path;
  bool recursive = false;
  Json ToJson() const;
  static absl::StatusOr<DeleteRequest> FromJson(const Json& j);
};

struct MoveRequest {
  static constexpr std::string_view kOp = "move";
  std::string from;
  std::string to;
  bool overwrite = false;
  Json ToJson() const;
  static absl::StatusOr<MoveRequest> FromJson(const Json& j);
};

// "read" (a byte range of a file) or "read_tar" (a directory as a tar stream, no range).
inline constexpr uint64_t kMaxFileOffset = uint64_t{1} << 62;
struct ReadRequest {
  static constexpr std::string_view kOp = "read";
  static constexpr std::string_view kTarOp = "read_tar";
  bool tar = false;
  std::string path;
  std::optional<uint64_t> offset;  // each <= kMaxFileOffset
  std::optional<uint64_t> length;
  std::optional<uint64_t> suffix;  // the last `suffix` bytes (instead of offset/length)
  Json ToJson() const;
  static absl::StatusOr<ReadRequest> FromJson(const Json& j);
};

// "write" (one file) or "write_tar" (a tar unpacked into a directory); the same fields.
struct WriteRequest {
  static constexpr std::string_view kOp = "write";
  static constexpr std::string_view kTarOp = "write_tar";
  bool tar = false;
  std::string path;
  std::optional<uint64_t> mode;       // <= 07777
  std::optional<uint64_t> uid;        // <= 0xFFFFFFFE
  std::optional<uint64_t> gid;
  std::optional<std::string> user;    // owner by name
  bool mkdirs = false;
  std::optional<uint64_t> max_bytes;  // <= kMaxFileOffset
  Json ToJson() const;
  static absl::StatusOr<WriteRequest> FromJson(const Json& j);
};

struct WatchRequest {
  static constexpr std::string_view kOp = "watch";
  std::string path;
  bool recursive = false;
  Json ToJson() const;
  static absl::StatusOr<WatchRequest> FromJson(const Json& j);
};

// A template build's RUN step on a microVM (docs/templates.md, "Builds"): the agent ends every
// process but its own, then streams its overlay's upper as an OCI layer tar (kData frames,
// then a kEnd ExportLayerEnd). Only an agent started with --upper-fd serves it.
struct ExportLayerRequest {
  static constexpr std::string_view kOp = "export_layer";
  uint64_t max_entries = UINT64_MAX;  // more is ResourceExhausted
  Json ToJson() const;
  static absl::StatusOr<ExportLayerRequest> FromJson(const Json& j);
};

using Request = std::variant<PingRequest, AttachRequest, StatusRequest, SignalRequest,
                             StdinRequest, StdinCloseRequest, ResizeRequest, ProcessesRequest,
                             StatRequest, ListRequest, MkdirRequest, DeleteRequest, MoveRequest,
                             ReadRequest, WriteRequest, WatchRequest, ExportLayerRequest>;

// A kRequest payload: depth-checked JSON object, dispatched on "op". InvalidArgument names the
// bad field ("request: no string \"op\"", "stat request: field \"path\" must be a string").
absl::StatusOr<Request> DecodeRequest(std::string_view payload);
// The request decoded from an already parsed object (the agent logs and forwards it too).
absl::StatusOr<Request> RequestFromJson(const Json& j);
// The "op" of a request.
std::string_view OpOf(const Request& r);

template <typename T>
std::string EncodeRequest(const T& request) {
  return DumpJson(request.ToJson());
}

// ---- replies ------------------------------------------------------------------------------
// Each has ToJson() (with "ok":true) and FromJson() (of an object whose "ok" is true).

struct PingReply {
  Json ToJson() const;
  static absl::StatusOr<PingReply> FromJson(const Json& j);
};

struct AttachReply {
  bool started = false;
  int64_t pid = 0;
  Json ToJson() const;
  static absl::StatusOr<AttachReply> FromJson(const Json& j);
};

struct StatusReply {
  std::string state = "unknown";  // created | running | exited | unknown
  std::optional<int64_t> pid;
  std::optional<int> exit_code;
  std::optional<std::string> signal;
  std::optional<std::string> started_at;
  std::optional<std::string> exited_at;
  bool oom_killed = false;
  bool timed_out = false;
  std::optional<bool> tty;  // absent for an unknown session
  std::optional<bool> stdin_pipe;
  Json ToJson() const;
  static absl::StatusOr<StatusReply> FromJson(const Json& j);
};

// "signal", "resize", "delete", and the host-side kEnd of an upload: {"ok":true}.
struct OkReply {
  Json ToJson() const;
  static absl::StatusOr<OkReply> FromJson(const Json& j);
};

// "stdin" and "stdin_close".
struct QueuedReply {
  uint64_t queued = 0;
  Json ToJson() const;
  static absl::StatusOr<QueuedReply> FromJson(const Json& j);
};

// E in protocol.h.
struct FileEntry {
  std::string name;
  std::string path;
  std::string type;  // file | directory | symlink | other
  uint64_t size = 0;
  uint64_t mode = 0;  // permission bits
  uint64_t uid = 0;
  uint64_t gid = 0;
  std::string mtime;  // RFC 3339
  std::optional<std::string> symlink_target;
  bool operator==(const FileEntry&) const = default;
  Json ToJson() const;
  static absl::StatusOr<FileEntry> FromJson(const Json& j, std::string_view what);
};

// "stat", "mkdir", "move", and the agent's kEnd after a "write".
struct EntryReply {
  FileEntry entry;
  Json ToJson() const;
  static absl::StatusOr<EntryReply> FromJson(const Json& j);
};

struct ReadReply {
  FileEntry entry;
  bool satisfiable = true;
  uint64_t offset = 0;
  uint64_t length = 0;
  Json ToJson() const;
  static absl::StatusOr<ReadReply> FromJson(const Json& j);
};

// The agent's kEnd after a "write_tar".
struct WriteTarEnd {
  uint64_t entries = 0;
  uint64_t skipped = 0;
  Json ToJson() const;
  static absl::StatusOr<WriteTarEnd> FromJson(const Json& j);
};

// The agent's kEnd after an "export_layer" (the guest's count: the host hashes and bounds the
// bytes itself, and the layer store counts the entries again when it unpacks them).
struct ExportLayerEnd {
  uint64_t entries = 0;
  uint64_t tar_bytes = 0;
  Json ToJson() const;
  static absl::StatusOr<ExportLayerEnd> FromJson(const Json& j);
};

// One kData frame of a "watch".
struct WatchEvent {
  std::string type;  // create | modify | delete | move | overflow
  std::string path;
  bool is_dir = false;
  std::optional<std::string> from;  // "move" only
  Json ToJson() const;
  static absl::StatusOr<WatchEvent> FromJson(const Json& j);
};
absl::StatusOr<WatchEvent> DecodeWatchEvent(std::string_view payload);

// {"ok":false,"error":{"code","message"[,"reason"]}}.
struct ErrorReply {
  std::string code = "internal";
  std::string message;
  std::optional<std::string> reason;  // file operations only
  Json ToJson() const;
  static ErrorReply FromStatus(const absl::Status& s,
                               std::optional<std::string> reason = std::nullopt);
  // The canonical code from "code", the API code from "reason" when present, else "code".
  absl::Status ToStatus() const;
  // Lenient on purpose: a field of another type is left empty, never an error.
  static ErrorReply FromJson(const Json& j);
};

// A reply payload (kResponse, or the agent's kEnd) as T: the agent's own error when "ok" is
// false, ApiError "bad_agent_reply" (502) when it is not JSON, has no boolean "ok" or does not
// decode as T.
template <typename T>
absl::StatusOr<T> DecodeReply(std::string_view payload, std::string_view what);
// The same for an already parsed object.
template <typename T>
absl::StatusOr<T> ReplyFromJson(const Json& j, std::string_view what);

// ---- implementation of the templates --------------------------------------------------------

// Shared part of DecodeReply: OK when "ok" is true; the agent's error or bad_agent_reply.
absl::Status CheckReplyOk(const Json& j, std::string_view what);
absl::Status BadReply(std::string_view what, const absl::Status& cause);

template <typename T>
absl::StatusOr<T> ReplyFromJson(const Json& j, std::string_view what) {
  if (absl::Status ok = CheckReplyOk(j, what); !ok.ok()) return ok;
  auto out = T::FromJson(j);
  if (!out.ok()) return BadReply(what, out.status());
  return out;
}

template <typename T>
absl::StatusOr<T> DecodeReply(std::string_view payload, std::string_view what) {
  auto j = ParseObjectPayload(payload, what);
  if (!j.ok()) return BadReply(what, j.status());
  return ReplyFromJson<T>(*j, what);
}

}  // namespace sbx::protocol
