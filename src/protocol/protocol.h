// The sbxd <-> sbx-agent protocol: versioned, length-prefixed frames over a stream socket (a
// unix socket for the ns runtime, virtio-serial/vsock for microVMs later).
//
// Wire format of one frame (all integers big-endian):
//   u32 payload_length | u8 version (kVersion) | u8 type (FrameType) | u16 reserved (0) | payload
// A receiver rejects a frame with another version, an unknown type, a non-zero reserved field
// or a payload longer than kMaxPayload, and then closes the connection. sbxd, reading an agent
// (which its guest may have broken), also holds each frame type to its own, smaller bound
// (protocol/limits.h): a frame over it is refused on its header, before its payload is read.
//
// One connection carries one request. The host sends kHello then kRequest without waiting; the
// agent answers kHello then kResponse. For "attach", the response is followed by a stream of
// kOutput / kResync frames and ends with one kExit frame, after which the agent closes.
// protocol/messages.h has a C++ type for every request and reply below; sbxd speaks it only
// through service/agent_client.h, over a transport (service/agent_transport.h).
//
// One byte stream (design, not implemented yet): a microVM runtime may have a single
// virtio-serial port per sandbox instead of a socket that accepts many connections. Such a
// transport multiplexes logical streams on it, each exactly one connection as described here:
//   - the header's reserved u16 carries a stream id (1..65535; 0 stays "no stream", which is
//     what every frame on a per-connection transport keeps sending, so nothing else changes);
//   - the host opens stream N by sending its kHello with id N (ids are chosen by the host,
//     never reused while open); every later frame of that connection, both ways, carries N;
//   - a zero-length frame of a new type kClose (9) with id N is the connection's close: sent
//     by either side where a socket would be closed (the agent after kExit, or a failed
//     upload; the host when a client goes away), and answered by the other side's kClose;
//   - flow control: each stream has a window of bytes (kMaxPayload to start) that the sender
//     may have unacknowledged; a kWindow frame (10) with id N and a u32 payload grants more.
//     Without it, one attach stream whose client stopped reading would stall every other
//     stream on the port, as a socket's own buffer does not.
// The AgentTransport on the host side hides all of this behind Open(); the agent's event loop
// would demultiplex into the same per-connection state it keeps today.
//
// Requests (kRequest payload, JSON object with "op"):
//   {"op":"ping"}                                  -> {"ok":true}
//   {"op":"attach","session_id":S,"after_event_id":N,
//    "spec":{"argv":[...],"cwd":"/","env":{...},"user":"root"}}
//       The first attach of S starts the process (spec required then); later attaches never
//       restart it and may omit spec. Response {"ok":true,"started":bool,"pid":P}, then every
//       retained event with id > N in order (kResync first if N+1 is older than the oldest
//       retained event), then live events until kExit.
//       A kResync can also come mid-stream: retention follows the fastest connection, so a
//       connection that falls behind another one may find its next events evicted. Ids and
//       offsets then continue from the kResync's values.
//   {"op":"status","session_id":S}
//       -> {"ok":true,"state":"created|running|exited","pid":P,"exit_code":int|null,
//           "signal":"SIGKILL"|null,"started_at":RFC3339|null,"exited_at":RFC3339|null}
//       state "unknown" when the agent never saw S.
//   {"op":"signal","session_id":S,"signal":15}     -> {"ok":true}
//       Sent to the session's process group; "signal" may also be a name ("TERM", "SIGTERM").
//       failed_precondition once the session has exited, not_found for an unknown S.
//   Interactive sessions (spec fields, all optional):
//     "stdin":true        stdin is a pipe fed by the "stdin" op (else /dev/null).
//     "tty":true | {"rows":R,"cols":C}
//                         a pty (default 24x80) on 0-2 of a new session (setsid + TIOCSCTTY);
//                         output is one stdout stream; stdin is the pty master, always open;
//                         TERM=xterm-256color unless env sets it.
//     "timeout_s":N       1..2592000 s from the process start, enforced by the agent: SIGTERM
//                         to the group, then SIGKILL after "kill_grace_s" (0..300, default 5)
//                         if it still runs; the exit event then has "timed_out":true.
//   {"op":"stdin","session_id":S,"data_b64":B64}  -> {"ok":true,"queued":bytes not yet written}
//       Appends to the session's stdin queue, written in order with non-blocking writes as the
//       process reads. resource_exhausted when the queue (1 MiB) cannot take the data (nothing
//       is queued then: retry later); failed_precondition when the session has no stdin, has
//       exited, stdin was closed, or the process closed its end (EPIPE).
//   {"op":"stdin_close","session_id":S}             -> {"ok":true,"queued":N}
//       EOF after the queued bytes: the pipe's write end is closed; a tty gets VEOF (^D).
//       Errors as for "stdin".
//   {"op":"resize","session_id":S,"rows":R,"cols":C} -> {"ok":true}
//       TIOCSWINSZ on the pty (the kernel sends SIGWINCH); failed_precondition without a tty
//       or after the exit.
//   {"op":"processes"}
//       -> {"ok":true,"processes":[{"pid","ppid","pgid","state","comm","argv":[...],
//           "argv_truncated":b,"uid","user":name|null,"started_at":RFC3339|null,
//           "session_id":S|null}],"truncated":b}
//       Every process of the sandbox (the agent's descendants when it is not PID 1) except
//       the agent. session_id: the session whose leader's pid is the process's group or
//       session id (children inherit both), else null. Bounded (protocol/limits.h), since a
//       guest chooses argv: at most kMaxProcessEntries (4096) entries and kMaxGuestReplyBytes
//       (4 MiB) of payload, "truncated":true when processes were left out; argv at most
//       kMaxArgvEntries (256) entries of kMaxArgBytes (4 KiB), kMaxArgvBytes (32 KiB) in all,
//       "argv_truncated":true when it was cut; comm and user at most kMaxFieldBytes (8 KiB).
//   "status" also returns "timed_out", "tty" and "stdin".
// Errors: {"ok":false,"error":{"code":"snake_case","message":"..."}}; the message is cut at
// kMaxFieldBytes (it may embed a guest's paths). Every reply other than "processes" and
// "list" stays under kMaxSmallResponseBytes by construction.
//
// Files (src/agent/files.h). Each file connection is served by a forked worker child of the
// agent, so its blocking disk I/O never stalls the event loop. "path" is resolved inside the
// sandbox's root (src/common/path_resolve.h); a relative path is relative to the workdir. Errors
// carry a specific "reason" besides "code" ("is_a_directory", "insufficient_storage", ...).
//   {"op":"stat","path":P}                         -> {"ok":true,"entry":E}
//   {"op":"list","path":P,"depth":N}               -> {"ok":true,"entries":[E...],"truncated":b}
//       Sorted by path, depth first. At most kMaxListEntries (10000) entries and
//       kMaxGuestReplyBytes (4 MiB) of payload; "truncated":true when entries were left out
//       (also an entry whose path would pass kMaxFieldBytes, 8 KiB).
//   {"op":"mkdir","path":P,"parents":b,"mode":M}   -> {"ok":true,"entry":E}
//   {"op":"delete","path":P,"recursive":b}         -> {"ok":true}
//   {"op":"move","from":P,"to":P,"overwrite":b}    -> {"ok":true,"entry":E}
//   {"op":"read","path":P,"offset":O,"length":L|null}
//       -> {"ok":true,"entry":E,"satisfiable":b,"offset":O,"length":L}, then kData frames
//          (L bytes in all, none when unsatisfiable), then kEnd {"ok":true} or an error.
//   {"op":"write","path":P,"mode":M|null,"uid":U|null,"gid":G|null,"user":S|null,
//    "mkdirs":b,"max_bytes":N|null}
//       -> {"ok":true} once a temporary file next to P exists; the host then sends kData
//          frames and one kEnd (payload {}); the agent fsyncs and renames the temporary over P
//          and answers kEnd {"ok":true,"entry":E} or an error (the temporary is removed). An
//          error may come before the host's kEnd; the agent then closes the connection.
//   {"op":"read_tar","path":DIR} -> {"ok":true}, kData frames of a tar stream, kEnd.
//   {"op":"write_tar","path":DIR,"mkdirs":b} -> like write: kData frames of a tar, the
//       host's kEnd, then kEnd {"ok":true,"entries":N} or an error.
//   {"op":"watch","path":DIR,"recursive":b} -> {"ok":true}, then one kData frame per event,
//       JSON {"type":"create|modify|delete|move|overflow","path","is_dir"[,"from"]}, until the
//       host closes the connection (the worker then exits) or DIR is deleted (kEnd).
//   {"op":"export_layer","max_entries":N} -> (a microVM build step's agent only, --upper-fd)
//       every other process of the guest SIGKILLed, {"ok":true}, kData frames of its overlay
//       upper as an OCI layer tar, kEnd {"ok":true,"entries":N,"tar_bytes":B} or an error.
//   E = {"name","path","type":"file|directory|symlink|other","size","mode" (permission bits),
//        "uid","gid","mtime" (RFC 3339),"symlink_target" (symlinks only)}
//
// Event ids start at 1 and increase by one per event, per session, across stdout, stderr and
// the exit event. Offsets count bytes per stream from 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::protocol {

using Json = nlohmann::json;

inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 8;
inline constexpr uint32_t kMaxPayload = 16u << 20;

enum class FrameType : uint8_t {
  kHello = 1,     // JSON {"version":1,"role":"host"|"agent"}
  kRequest = 2,   // JSON, see above
  kResponse = 3,  // JSON, see above
  kOutput = 4,    // binary, see OutputEvent
  kExit = 5,      // JSON ExitEvent
  kResync = 6,    // JSON ResyncEvent
  kData = 7,      // binary: a chunk of file (or tar) bytes, either direction; see "files"
  kEnd = 8,       // JSON: end of a kData stream; from the agent it carries the final result
};

struct Frame {
  FrameType type;
  std::string payload;
};

enum class Stream : uint8_t { kStdout = 1, kStderr = 2 };

// kOutput payload: u64 event_id | u8 stream | u64 offset | data bytes.
struct OutputEvent {
  uint64_t event_id = 0;
  Stream stream = Stream::kStdout;
  uint64_t offset = 0;
  std::string data;
};

// kExit payload (JSON): {"event_id","exit_code","signal","timed_out","oom_killed"}.
struct ExitEvent {
  uint64_t event_id = 0;
  std::optional<int> exit_code;       // set when the process exited normally
  std::optional<std::string> signal;  // "SIGKILL" when killed by a signal
  bool timed_out = false;
  bool oom_killed = false;
};

// kResync payload (JSON): {"oldest_available_id","stdout_offset","stderr_offset"}.
struct ResyncEvent {
  uint64_t oldest_available_id = 0;
  uint64_t stdout_offset = 0;  // offset of the first retained stdout byte
  uint64_t stderr_offset = 0;
};

std::string EncodeFrame(FrameType type, std::string_view payload);
// Validates the 8 header bytes; returns the type and payload length.
absl::StatusOr<std::pair<FrameType, uint32_t>> DecodeHeader(const uint8_t* header);

// Incremental decoder for a byte stream (used by the agent's event loop and by the fuzzer).
class FrameDecoder {
 public:
  // sbxd reading an agent: frames are held to the per-type bounds of protocol/limits.h
  // (kResponse to kMaxGuestReplyBytes when `guest_sized_response`, else
  // kMaxSmallResponseBytes), checked on the header, before any of the payload is buffered.
  // A frame over its bound is ApiError "bad_agent_reply". Without this call only kMaxPayload
  // applies (the agent reading sbxd, which it trusts).
  void LimitToAgentBounds(bool guest_sized_response) {
    agent_bounds_ = true;
    guest_sized_response_ = guest_sized_response;
  }
  void Feed(std::string_view bytes);
  // A complete frame, nullopt if more bytes are needed, or an error (the stream is then dead).
  absl::StatusOr<std::optional<Frame>> Next();
  size_t buffered() const { return buf_.size() - pos_; }
  // Hands the bytes fed but not yet returned as frames to another reader (the decoder is
  // then empty): sbxd's attach path reads on in its own buffer (AgentStream::NextViews).
  std::string TakeBuffered();
  bool limited_to_agent_bounds() const { return agent_bounds_; }
  bool guest_sized_response() const { return guest_sized_response_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  bool agent_bounds_ = false;
  bool guest_sized_response_ = false;
};

std::string EncodeOutput(const OutputEvent& ev);
// Appends a whole kOutput frame (header and payload) to `out`: the agent's streaming path,
// which copies the output bytes once instead of building the payload and then the frame.
// Same bytes as EncodeFrame(kOutput, EncodeOutput(...)).
void AppendOutputFrame(std::string& out, uint64_t event_id, Stream stream, uint64_t offset,
                       std::string_view data);
// The same frame without its data: what goes on the wire before `data_size` bytes of output
// that the caller sends from where they are (the agent's large events, by sendmsg).
void AppendOutputFrameHeader(std::string& out, uint64_t event_id, Stream stream,
                             uint64_t offset, size_t data_size);
absl::StatusOr<OutputEvent> DecodeOutput(std::string_view payload);
// DecodeOutput without copying the data: `data` points into `payload`.
struct OutputEventView {
  uint64_t event_id = 0;
  Stream stream = Stream::kStdout;
  uint64_t offset = 0;
  std::string_view data;
};
absl::StatusOr<OutputEventView> DecodeOutputView(std::string_view payload);
std::string EncodeExit(const ExitEvent& ev);
absl::StatusOr<ExitEvent> DecodeExit(std::string_view payload);
std::string EncodeResync(const ResyncEvent& ev);
absl::StatusOr<ResyncEvent> DecodeResync(std::string_view payload);

// A JSON payload (a request, a response, an end frame, a watch event) as an object. Each side
// of the socket distrusts the other, so the payload is depth-checked (common/json_util.h,
// kMaxUntrustedJsonDepth) before a tree exists: what comes out may be dumped and copied.
// InvalidArgument "<what>: ..." when it is not valid JSON, nests too deep or is not an object.
absl::StatusOr<Json> ParseObjectPayload(std::string_view payload, std::string_view what);
// Reads of a payload's fields that never throw: the field's value when it has that type, else
// `fallback`. The other side may send anything in any field, and json::value() throws on a
// field of another type (a throw in a timer thread ends sbxd).
std::string StringField(const Json& obj, const char* key, std::string fallback = "");
bool BoolField(const Json& obj, const char* key, bool fallback = false);
// An agent response's "ok": true only for a boolean true.
bool ResponseOk(const Json& response);

// The "code" of an agent error response <-> absl codes: the agent names its errors with these,
// sbxd maps them back. Unknown names are kInternal; codes without a name are "internal".
std::string ErrorCodeName(absl::StatusCode code);
absl::StatusCode ErrorCodeFromName(std::string_view name);

// Signal numbers <-> "SIGTERM" names, for the signals a session can receive or die from.
std::optional<std::string> SignalName(int signo);
std::optional<int> SignalNumber(std::string_view name);  // accepts "TERM" and "SIGTERM"

// A parsed response or kEnd: OK for "ok":true, else the status its error names ("agent: CODE:
// MESSAGE"); no boolean "ok" is Internal, naming `what`.
absl::Status ReplyStatus(const Json& reply, std::string_view what);

// A blocking client for one request on one connection; used by runtimes (readiness), tests and
// the fuzz corpus generator. sbxd's own calls go through service/agent_client.h.
class AgentConnection {
 public:
  // Connects to the agent's unix socket; `timeout_ms` bounds connect and every read/write.
  static absl::StatusOr<AgentConnection> Connect(const std::string& socket_path,
                                                 int timeout_ms = 5000);
  AgentConnection(AgentConnection&&) noexcept;
  AgentConnection& operator=(AgentConnection&&) noexcept;
  ~AgentConnection();

  // Sends hello + request, reads the agent's hello and the response. A response with
  // "ok":false becomes an error status carrying the agent's code and message. Frames are held
  // to protocol/limits.h's bounds (guest-sized for the ops IsGuestSizedOp names). This client
  // builds a tree of the response: sbxd's request path for guest-sized ops does not use it
  // (service/agent_client.h, ProcessesBody and ListBody).
  absl::StatusOr<Json> Call(const Json& request);
  // After an attach Call(): the next event frame; NotFound-free EOF is reported as
  // Unavailable("agent closed the stream").
  absl::StatusOr<Frame> ReadFrame();

 private:
  explicit AgentConnection(int fd) : fd_(fd) {}
  int fd_ = -1;
  FrameDecoder decoder_;
};

// Convenience: one request on a fresh connection.
absl::StatusOr<Json> CallAgent(const std::string& socket_path, const Json& request,
                               int timeout_ms = 5000);

}  // namespace sbx::protocol
