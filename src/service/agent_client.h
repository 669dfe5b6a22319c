// The one place sbxd talks to agents (issue 14): typed calls and streams of the agent protocol
// (protocol/messages.h) over an AgentTransport (service/agent_transport.h). The API and the
// service's own timers use this; neither builds a request nor decodes a frame.
//
// Every call opens its own stream (one request per stream, protocol.h) and never blocks an io
// thread: calls are awaitables on the caller's executor. The agent sits on the guest's side of
// the boundary, so every reply is decoded strictly (a malformed one is 502 bad_agent_reply)
// and frames are held to the bounds of protocol/limits.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio.hpp>

#include "absl/status/statusor.h"
#include "protocol/guest_reply.h"
#include "protocol/messages.h"
#include "service/agent_stream.h"
#include "service/agent_types.h"
#include "service/agent_transport.h"

namespace sbx::service {

// How long a short call may take (connect, request, reply).
inline constexpr std::chrono::milliseconds kSessionCallTimeout{5000};
inline constexpr std::chrono::milliseconds kStatusCallTimeout{2000};
inline constexpr std::chrono::milliseconds kFileCallTimeout{10000};
// Connect, request and reply of a stream (attach, read, write, watch).
inline constexpr std::chrono::milliseconds kStreamOpenTimeout{10000};
// How long a file transfer may see nothing from the agent (a slow disk, an fsync of a large
// file) before it is abandoned: kTransferIdlePeriods periods of kTransferIdle.
inline constexpr std::chrono::seconds kTransferIdle{30};
inline constexpr int kTransferIdlePeriods = 10;
// How long an attach that started a process waits for it to end before the store records it
// "running" (AttachStream::ExitWithin): an exec of `true` ends ~1 ms after the reply. A
// process still silent then has its response header this much later; output ends the wait.
inline constexpr std::chrono::milliseconds kAttachExitWithin{10};

// One event of an attach stream. An output event's data points into the frame it came in
// (AttachFrame): no copy between the agent's bytes and the SSE/WebSocket encoder.
struct AttachEvent {
  enum class Kind { kOutput, kResync, kExit, kOther };
  Kind kind = Kind::kOther;
  protocol::OutputEventView output;
  OutputResync resync;
  SessionExit exit;
};

// A frame of an attach stream, decoded on demand (Decode) so that a batch of them can be
// sized before any is rendered.
class AttachFrame {
 public:
  explicit AttachFrame(protocol::Frame f) : frame_(std::move(f)) {}
  // A frame that points into its stream's buffer (AttachStream::NextBatch): valid until the
  // stream's next call.
  explicit AttachFrame(AgentStream::FrameView v) : view_(v), is_view_(true) {}
  bool is_output() const { return type() == protocol::FrameType::kOutput; }
  size_t payload_size() const { return payload().size(); }
  // InvalidArgument when the frame does not decode (the stream should end).
  absl::StatusOr<AttachEvent> Decode() const;

 private:
  protocol::FrameType type() const { return is_view_ ? view_.type : frame_.type; }
  std::string_view payload() const { return is_view_ ? view_.payload : frame_.payload; }

  protocol::Frame frame_;
  AgentStream::FrameView view_{};
  bool is_view_ = false;
};

class AttachStream {
 public:
  AttachStream(std::unique_ptr<AgentStream> s, protocol::AttachReply reply)
      : s_(std::move(s)), reply_(reply) {}
  const protocol::AttachReply& reply() const { return reply_; }
  // Whether this attach started the session's process.
  bool started() const { return reply_.started; }
  // Waits up to `wait` for the first frames (NextBatch's, kept for it) and returns the exit
  // among them, when every frame before it decodes (the caller relays them all, then the
  // exit). Lets the caller record a process that was over by then in one store transaction
  // instead of "running" then "exited". Only before the first NextBatch.
  asio::awaitable<std::optional<SessionExit>> ExitWithin(std::chrono::milliseconds wait,
                                                         size_t max_payload);
  // The next frame; nullopt after `idle` without one (see AgentStream::Next).
  asio::awaitable<absl::StatusOr<std::optional<AttachFrame>>> Next(std::chrono::milliseconds idle);
  // A frame that already arrived, without waiting (batching).
  std::optional<AttachFrame> TryNext();
  // The bulk form of Next + TryNext (AgentStream::NextViews): every frame the agent has sent,
  // at least one, up to about `max_payload` bytes, pointing into the stream's buffer until
  // the next call. `out` empty: nothing within `idle`. Never mixed with Next/TryNext.
  asio::awaitable<absl::Status> NextBatch(std::chrono::milliseconds idle, size_t max_payload,
                                          std::vector<AttachFrame>& out);
  void Close() { s_->Close(); }

 private:
  std::unique_ptr<AgentStream> s_;
  protocol::AttachReply reply_;
  std::vector<AgentStream::FrameView> views_;
  // ExitWithin's read, handed out by the next NextBatch.
  bool primed_ = false;
  absl::Status primed_status_;
};

// A download ("read", "read_tar"): the reply, then chunks of bytes until the end.
class DownloadStream {
 public:
  DownloadStream(std::unique_ptr<AgentStream> s, protocol::ReadReply reply)
      : s_(std::move(s)), reply_(std::move(reply)) {}
  const protocol::ReadReply& reply() const { return reply_; }
  // The next chunk; an empty optional at the end of the transfer (the agent's kEnd said ok).
  // An error when the agent failed midway, went silent for too long or broke the protocol.
  asio::awaitable<absl::StatusOr<std::optional<std::string>>> NextChunk();
  void Close() { s_->Close(); }

 private:
  std::unique_ptr<AgentStream> s_;
  protocol::ReadReply reply_;
};

// An upload ("write", "write_tar"): chunks, then Finish().
class UploadStream {
 public:
  struct Result {
    std::optional<FileEntry> entry;         // "write"
    std::optional<protocol::WriteTarEnd> tar;  // "write_tar"
  };
  UploadStream(std::unique_ptr<AgentStream> s, bool tar) : s_(std::move(s)), tar_(tar) {}
  // Sends one chunk. When the agent stopped taking data, the error says why (it failed: disk
  // full, too large) and the stream is closed.
  asio::awaitable<absl::Status> Send(std::string_view chunk);
  // Ends the upload and returns the agent's result; the stream is closed.
  asio::awaitable<absl::StatusOr<Result>> Finish();
  // Abandons the upload: the agent sees EOF and removes its temporary file.
  void Abort() { s_->Close(); }

 private:
  asio::awaitable<absl::StatusOr<Result>> ReadEnd();
  std::unique_ptr<AgentStream> s_;
  bool tar_;
};

// A directory watch: events until the directory goes away (nullopt event with ended()) or the
// caller closes it.
class WatchStream {
 public:
  explicit WatchStream(std::unique_ptr<AgentStream> s) : s_(std::move(s)) {}
  // The next event; nullopt after `idle` without one, or when the watch ended (ended()).
  asio::awaitable<absl::StatusOr<std::optional<FileWatchEvent>>> Next(
      std::chrono::milliseconds idle);
  bool ended() const { return ended_; }
  void Close() { s_->Close(); }

 private:
  std::unique_ptr<AgentStream> s_;
  bool ended_ = false;
};

class AgentClient {
 public:
  explicit AgentClient(std::shared_ptr<AgentTransport> transport)
      : transport_(std::move(transport)) {}
  // The unix socket of the ns and fake runtimes.
  static AgentClient ForSocket(std::string path);

  template <typename T>
  using Call = asio::awaitable<absl::StatusOr<T>>;
  using Ex = asio::any_io_executor;

  // Sessions.
  Call<SessionStatus> Status(Ex ex, std::string session_id,
                             std::chrono::milliseconds timeout = kStatusCallTimeout);
  // Status() from a thread without an executor (the service's timers).
  absl::StatusOr<SessionStatus> StatusBlocking(const std::string& session_id,
                                               std::chrono::milliseconds timeout =
                                                   kStatusCallTimeout);
  Call<AttachStream> Attach(Ex ex, std::string session_id, uint64_t after_event_id,
                            std::optional<SessionSpec> spec);
  asio::awaitable<absl::Status> Signal(Ex ex, std::string session_id, int signo);
  // Queues `data` on the session's stdin; the bytes still queued in the agent.
  Call<uint64_t> Stdin(Ex ex, std::string session_id, std::string_view data);
  Call<uint64_t> StdinClose(Ex ex, std::string session_id);
  asio::awaitable<absl::Status> Resize(Ex ex, std::string session_id, uint16_t rows, uint16_t cols);
  // The process list rendered as `head` + "processes":[...],"truncated":b} without a tree of
  // it (protocol/guest_reply.h).
  Call<std::string> ProcessesBody(Ex ex, std::string head);

  // Files.
  Call<FileEntry> Stat(Ex ex, std::string path);
  // The listing rendered as `head` + "entries":[...],"truncated":b}.
  Call<std::string> ListBody(Ex ex, ListRequest request, std::string head);
  Call<FileEntry> Mkdir(Ex ex, MkdirRequest request);
  asio::awaitable<absl::Status> Delete(Ex ex, std::string path, bool recursive);
  Call<FileEntry> Move(Ex ex, MoveRequest request);
  Call<DownloadStream> Read(Ex ex, ReadRequest request);
  Call<UploadStream> Write(Ex ex, WriteRequest request);
  Call<WatchStream> Watch(Ex ex, WatchRequest request);

  const AgentTransport& transport() const { return *transport_; }

  // Turns a lost agent (Unavailable: the stream closed, the socket refused) into what happened
  // to its sandbox meanwhile, e.g. a suspend that ended the agent while a file op waited: the
  // caller then gets 409 sandbox_not_running, as a moment later, not a 503.
  using Explainer = std::function<absl::Status(absl::Status)>;
  void set_explainer(Explainer e) { explain_ = std::move(e); }

 private:
  absl::Status Explained(absl::Status s) const {
    return s.code() == absl::StatusCode::kUnavailable && explain_ ? explain_(std::move(s)) : s;
  }
  // One request, its reply decoded as T; the stream is closed.
  template <typename T>
  Call<T> Unary(Ex ex, std::string request, std::string_view what,
                std::chrono::milliseconds timeout);
  // A file op whose reply is an entry (stat, mkdir, move).
  Call<FileEntry> EntryCall(Ex ex, std::string request, std::string_view what);
  // A stream whose reply decodes as T (attach, read, write, watch); closed when it does not.
  template <typename T>
  Call<std::pair<std::unique_ptr<AgentStream>, T>> OpenStream(Ex ex, std::string request,
                                                              std::string_view what);
  Call<std::string> GuestSized(Ex ex, std::string request, const protocol::GuestListSchema& schema,
                               std::string head);

  std::shared_ptr<AgentTransport> transport_;
  Explainer explain_;
};

}  // namespace sbx::service
