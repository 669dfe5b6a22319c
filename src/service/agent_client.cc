#include "service/agent_client.h"

#include <fmt/format.h>

#include "common/encoding.h"
#include "common/status_util.h"

namespace sbx::service {
namespace {

using protocol::DecodeReply;
using protocol::EncodeRequest;
using protocol::FrameType;

absl::Status Malformed(std::string_view what) {
  return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                  fmt::format("agent protocol: {}", what));
}

}  // namespace

AgentClient AgentClient::ForSocket(std::string path) {
  return AgentClient(std::make_shared<UnixSocketTransport>(std::move(path)));
}

template <typename T>
AgentClient::Call<T> AgentClient::Unary(Ex ex, std::string request, std::string_view what,
                                        std::chrono::milliseconds timeout) {
  auto s = co_await AgentStream::Open(ex, *transport_, std::move(request), timeout);
  if (!s.ok()) co_return s.status();
  (*s)->Close();
  co_return DecodeReply<T>((*s)->response_payload(), what);
}

AgentClient::Call<std::string> AgentClient::GuestSized(Ex ex, std::string request,
                                                       const protocol::GuestListSchema& schema,
                                                       std::string head) {
  auto s = co_await AgentStream::Open(ex, *transport_, std::move(request), kFileCallTimeout,
                                      /*guest_sized=*/true);
  if (!s.ok()) co_return s.status();
  (*s)->Close();
  std::string payload = std::move((*s)->response_payload());
  s->reset();
  auto body = protocol::RewriteGuestList(payload, schema, head);
  // The agent's bytes are not needed past here: free them before the (slow) write.
  std::string().swap(payload);
  co_return body;
}

// ---- sessions ---------------------------------------------------------------------------

AgentClient::Call<SessionStatus> AgentClient::Status(Ex ex, std::string session_id,
                                                     std::chrono::milliseconds timeout) {
  co_return co_await Unary<SessionStatus>(
      ex, EncodeRequest(protocol::StatusRequest{std::move(session_id)}), "status reply", timeout);
}

absl::StatusOr<SessionStatus> AgentClient::StatusBlocking(const std::string& session_id,
                                                          std::chrono::milliseconds timeout) {
  asio::io_context ioc;
  absl::StatusOr<SessionStatus> out = absl::UnknownError("agent call did not run");
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        out = co_await Status(ioc.get_executor(), session_id, timeout);
      },
      asio::detached);
  ioc.run();
  return out;
}

AgentClient::Call<AttachStream> AgentClient::Attach(Ex ex, std::string session_id,
                                                    uint64_t after_event_id,
                                                    std::optional<SessionSpec> spec) {
  protocol::AttachRequest req{std::move(session_id), after_event_id, std::move(spec)};
  auto s = co_await AgentStream::Open(ex, *transport_, EncodeRequest(req), std::chrono::seconds(10));
  if (!s.ok()) co_return s.status();
  auto reply = DecodeReply<protocol::AttachReply>((*s)->response_payload(), "attach reply");
  if (!reply.ok()) {
    (*s)->Close();
    co_return reply.status();
  }
  co_return AttachStream(std::move(*s), *reply);
}

asio::awaitable<absl::Status> AgentClient::Signal(Ex ex, std::string session_id, int signo) {
  auto r = co_await Unary<protocol::OkReply>(
      ex, EncodeRequest(protocol::SignalRequest{std::move(session_id), signo}), "signal reply",
      kSessionCallTimeout);
  co_return r.status();
}

AgentClient::Call<uint64_t> AgentClient::Stdin(Ex ex, std::string session_id,
                                               std::string_view data) {
  auto r = co_await Unary<protocol::QueuedReply>(
      ex, EncodeRequest(protocol::StdinRequest{std::move(session_id), Base64Encode(data)}),
      "stdin reply", kSessionCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return r->queued;
}

AgentClient::Call<uint64_t> AgentClient::StdinClose(Ex ex, std::string session_id) {
  auto r = co_await Unary<protocol::QueuedReply>(
      ex, EncodeRequest(protocol::StdinCloseRequest{std::move(session_id)}), "stdin_close reply",
      kSessionCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return r->queued;
}

asio::awaitable<absl::Status> AgentClient::Resize(Ex ex, std::string session_id, uint16_t rows,
                                                  uint16_t cols) {
  auto r = co_await Unary<protocol::OkReply>(
      ex, EncodeRequest(protocol::ResizeRequest{std::move(session_id), rows, cols}),
      "resize reply", kSessionCallTimeout);
  co_return r.status();
}

AgentClient::Call<std::string> AgentClient::ProcessesBody(Ex ex, std::string head) {
  co_return co_await GuestSized(ex, EncodeRequest(protocol::ProcessesRequest{}),
                                protocol::ProcessesReplySchema(), std::move(head));
}

// ---- files ------------------------------------------------------------------------------

AgentClient::Call<FileEntry> AgentClient::Stat(Ex ex, std::string path) {
  auto r = co_await Unary<protocol::EntryReply>(
      ex, EncodeRequest(protocol::StatRequest{std::move(path)}), "stat reply", kFileCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return std::move(r->entry);
}

AgentClient::Call<std::string> AgentClient::ListBody(Ex ex, ListRequest request,
                                                     std::string head) {
  co_return co_await GuestSized(ex, EncodeRequest(request), protocol::ListReplySchema(),
                                std::move(head));
}

AgentClient::Call<FileEntry> AgentClient::Mkdir(Ex ex, MkdirRequest request) {
  auto r = co_await Unary<protocol::EntryReply>(ex, EncodeRequest(request), "mkdir reply",
                                                kFileCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return std::move(r->entry);
}

asio::awaitable<absl::Status> AgentClient::Delete(Ex ex, std::string path, bool recursive) {
  auto r = co_await Unary<protocol::OkReply>(
      ex, EncodeRequest(protocol::DeleteRequest{std::move(path), recursive}), "delete reply",
      kFileCallTimeout);
  co_return r.status();
}

AgentClient::Call<FileEntry> AgentClient::Move(Ex ex, MoveRequest request) {
  auto r = co_await Unary<protocol::EntryReply>(ex, EncodeRequest(request), "move reply",
                                                kFileCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return std::move(r->entry);
}

AgentClient::Call<DownloadStream> AgentClient::Read(Ex ex, ReadRequest request) {
  auto s = co_await AgentStream::Open(ex, *transport_, EncodeRequest(request), kFileCallTimeout);
  if (!s.ok()) co_return s.status();
  auto reply = DecodeReply<protocol::ReadReply>((*s)->response_payload(), "read reply");
  if (!reply.ok()) {
    (*s)->Close();
    co_return reply.status();
  }
  co_return DownloadStream(std::move(*s), std::move(*reply));
}

AgentClient::Call<UploadStream> AgentClient::Write(Ex ex, WriteRequest request) {
  auto s = co_await AgentStream::Open(ex, *transport_, EncodeRequest(request), kFileCallTimeout);
  if (!s.ok()) co_return s.status();
  auto reply = DecodeReply<protocol::OkReply>((*s)->response_payload(), "write reply");
  if (!reply.ok()) {
    (*s)->Close();
    co_return reply.status();
  }
  co_return UploadStream(std::move(*s), request.tar);
}

AgentClient::Call<WatchStream> AgentClient::Watch(Ex ex, WatchRequest request) {
  auto s = co_await AgentStream::Open(ex, *transport_, EncodeRequest(request), kFileCallTimeout);
  if (!s.ok()) co_return s.status();
  auto reply = DecodeReply<protocol::OkReply>((*s)->response_payload(), "watch reply");
  if (!reply.ok()) {
    (*s)->Close();
    co_return reply.status();
  }
  co_return WatchStream(std::move(*s));
}

// ---- streams ----------------------------------------------------------------------------

absl::StatusOr<AttachEvent> AttachFrame::Decode() const {
  AttachEvent ev;
  switch (frame_.type) {
    case FrameType::kOutput: {
      SBX_ASSIGN_OR_RETURN(ev.output, protocol::DecodeOutputView(frame_.payload));
      ev.kind = AttachEvent::Kind::kOutput;
      break;
    }
    case FrameType::kResync: {
      SBX_ASSIGN_OR_RETURN(ev.resync, protocol::DecodeResync(frame_.payload));
      ev.kind = AttachEvent::Kind::kResync;
      break;
    }
    case FrameType::kExit: {
      SBX_ASSIGN_OR_RETURN(ev.exit, protocol::DecodeExit(frame_.payload));
      ev.kind = AttachEvent::Kind::kExit;
      break;
    }
    default:
      break;  // nothing else belongs in an attach stream; skipped
  }
  return ev;
}

asio::awaitable<absl::StatusOr<std::optional<AttachFrame>>> AttachStream::Next(
    std::chrono::milliseconds idle) {
  auto f = co_await s_->Next(idle);
  if (!f.ok()) co_return f.status();
  if (!*f) co_return std::optional<AttachFrame>();
  co_return std::optional<AttachFrame>(AttachFrame(std::move(**f)));
}

std::optional<AttachFrame> AttachStream::TryNext() {
  auto f = s_->TryNext();
  if (!f) return std::nullopt;
  return AttachFrame(std::move(*f));
}

asio::awaitable<absl::StatusOr<std::optional<std::string>>> DownloadStream::NextChunk() {
  for (int idle = 0; idle < kTransferIdlePeriods;) {
    auto f = co_await s_->Next(kTransferIdle);
    if (!f.ok()) co_return f.status();
    if (!*f) {
      ++idle;
      continue;
    }
    if ((*f)->type == FrameType::kData) co_return std::optional<std::string>(std::move((*f)->payload));
    if ((*f)->type != FrameType::kEnd) co_return Malformed("expected data or the end of a download");
    auto end = DecodeReply<protocol::OkReply>((*f)->payload, "end frame");
    if (!end.ok()) co_return end.status();
    co_return std::optional<std::string>();
  }
  co_return absl::DeadlineExceededError("the agent sent nothing in time");
}

asio::awaitable<absl::StatusOr<UploadStream::Result>> UploadStream::ReadEnd() {
  for (int idle = 0; idle < kTransferIdlePeriods;) {
    auto f = co_await s_->Next(kTransferIdle);
    if (!f.ok()) co_return f.status();
    if (!*f) {
      ++idle;
      continue;
    }
    if ((*f)->type == FrameType::kData) continue;
    if ((*f)->type != FrameType::kEnd) {
      co_return absl::InternalError("agent protocol: expected the end of a file transfer");
    }
    Result r;
    if (tar_) {
      auto end = DecodeReply<protocol::WriteTarEnd>((*f)->payload, "end frame");
      if (!end.ok()) co_return end.status();
      r.tar = *end;
    } else {
      auto end = DecodeReply<protocol::EntryReply>((*f)->payload, "end frame");
      if (!end.ok()) co_return end.status();
      r.entry = std::move(end->entry);
    }
    co_return r;
  }
  co_return absl::DeadlineExceededError("the agent did not finish the transfer in time");
}

asio::awaitable<absl::Status> UploadStream::Send(std::string_view chunk) {
  auto sent = co_await s_->Send(protocol::EncodeFrame(FrameType::kData, chunk),
                                kTransferIdle * kTransferIdlePeriods);
  if (sent.ok()) co_return sent;
  // The agent stopped reading: it failed (disk full, too large) and said why.
  auto end = co_await ReadEnd();
  s_->Close();
  co_return end.ok() ? sent : end.status();
}

asio::awaitable<absl::StatusOr<UploadStream::Result>> UploadStream::Finish() {
  auto sent = co_await s_->Send(protocol::EncodeFrame(FrameType::kEnd, "{}"),
                                kTransferIdle * kTransferIdlePeriods);
  if (!sent.ok()) {
    auto end = co_await ReadEnd();
    s_->Close();
    if (end.ok()) co_return sent;
    co_return end.status();
  }
  auto end = co_await ReadEnd();
  s_->Close();
  co_return end;
}

asio::awaitable<absl::StatusOr<std::optional<FileWatchEvent>>> WatchStream::Next(
    std::chrono::milliseconds idle) {
  for (;;) {
    auto f = co_await s_->Next(idle);
    if (!f.ok()) co_return f.status();
    if (!*f) co_return std::optional<FileWatchEvent>();
    if ((*f)->type == FrameType::kEnd) {  // the directory itself went away
      ended_ = true;
      co_return std::optional<FileWatchEvent>();
    }
    if ((*f)->type != FrameType::kData) continue;
    // An event that does not decode is dropped: the guest may write anything here.
    auto ev = protocol::DecodeWatchEvent((*f)->payload);
    if (ev.ok()) co_return std::optional<FileWatchEvent>(std::move(*ev));
  }
}

}  // namespace sbx::service
