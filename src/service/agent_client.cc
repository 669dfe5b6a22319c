#include "service/agent_client.h"

#include <utility>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/status_util.h"

namespace sbx::service {
namespace {

using protocol::DecodeReply;
using protocol::EncodeRequest;
using protocol::Frame;
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
  if (!s.ok()) co_return Explained(s.status());
  (*s)->Close();
  co_return DecodeReply<T>((*s)->response_payload(), what);
}

template <typename T>
AgentClient::Call<std::pair<std::unique_ptr<AgentStream>, T>> AgentClient::OpenStream(
    Ex ex, std::string request, std::string_view what) {
  auto s = co_await AgentStream::Open(ex, *transport_, std::move(request), kStreamOpenTimeout);
  if (!s.ok()) co_return Explained(s.status());
  auto reply = DecodeReply<T>((*s)->response_payload(), what);
  if (!reply.ok()) {
    (*s)->Close();
    co_return reply.status();
  }
  co_return std::make_pair(std::move(*s), std::move(*reply));
}

AgentClient::Call<std::string> AgentClient::GuestSized(Ex ex, std::string request,
                                                       const protocol::GuestListSchema& schema,
                                                       std::string head) {
  auto s = co_await AgentStream::Open(ex, *transport_, std::move(request), kFileCallTimeout,
                                      /*guest_sized=*/true);
  if (!s.ok()) co_return Explained(s.status());
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
  // Named values, not temporaries, across co_await: GCC 12 destroys some temporaries of a
  // co_await expression twice.
  std::string request = EncodeRequest(protocol::StatusRequest{std::move(session_id)});
  co_return co_await Unary<SessionStatus>(ex, std::move(request), "status reply", timeout);
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
  std::string encoded = EncodeRequest(req);
  auto opened = co_await OpenStream<protocol::AttachReply>(ex, std::move(encoded), "attach reply");
  if (!opened.ok()) co_return opened.status();
  co_return AttachStream(std::move(opened->first), opened->second);
}

asio::awaitable<absl::Status> AgentClient::Signal(Ex ex, std::string session_id, int signo) {
  std::string request = EncodeRequest(protocol::SignalRequest{std::move(session_id), signo});
  auto r = co_await Unary<protocol::OkReply>(ex, std::move(request), "signal reply",
                                             kSessionCallTimeout);
  co_return r.status();
}

AgentClient::Call<uint64_t> AgentClient::Stdin(Ex ex, std::string session_id,
                                               std::string_view data) {
  std::string request =
      EncodeRequest(protocol::StdinRequest{std::move(session_id), Base64Encode(data)});
  auto r = co_await Unary<protocol::QueuedReply>(ex, std::move(request), "stdin reply",
                                                 kSessionCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return r->queued;
}

AgentClient::Call<uint64_t> AgentClient::StdinClose(Ex ex, std::string session_id) {
  std::string request = EncodeRequest(protocol::StdinCloseRequest{std::move(session_id)});
  auto r = co_await Unary<protocol::QueuedReply>(ex, std::move(request), "stdin_close reply",
                                                 kSessionCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return r->queued;
}

asio::awaitable<absl::Status> AgentClient::Resize(Ex ex, std::string session_id, uint16_t rows,
                                                  uint16_t cols) {
  std::string request = EncodeRequest(protocol::ResizeRequest{std::move(session_id), rows, cols});
  auto r = co_await Unary<protocol::OkReply>(ex, std::move(request), "resize reply",
                                             kSessionCallTimeout);
  co_return r.status();
}

AgentClient::Call<std::string> AgentClient::ProcessesBody(Ex ex, std::string head) {
  std::string request = EncodeRequest(protocol::ProcessesRequest{});
  co_return co_await GuestSized(ex, std::move(request), protocol::ProcessesReplySchema(),
                                std::move(head));
}

// ---- files ------------------------------------------------------------------------------

AgentClient::Call<FileEntry> AgentClient::EntryCall(Ex ex, std::string request,
                                                    std::string_view what) {
  auto r = co_await Unary<protocol::EntryReply>(ex, std::move(request), what, kFileCallTimeout);
  if (!r.ok()) co_return r.status();
  co_return std::move(r->entry);
}

AgentClient::Call<FileEntry> AgentClient::Stat(Ex ex, std::string path) {
  std::string request = EncodeRequest(protocol::StatRequest{std::move(path)});
  co_return co_await EntryCall(ex, std::move(request), "stat reply");
}

AgentClient::Call<std::string> AgentClient::ListBody(Ex ex, ListRequest request,
                                                     std::string head) {
  std::string encoded = EncodeRequest(request);
  co_return co_await GuestSized(ex, std::move(encoded), protocol::ListReplySchema(),
                                std::move(head));
}

AgentClient::Call<FileEntry> AgentClient::Mkdir(Ex ex, MkdirRequest request) {
  std::string encoded = EncodeRequest(request);
  co_return co_await EntryCall(ex, std::move(encoded), "mkdir reply");
}

asio::awaitable<absl::Status> AgentClient::Delete(Ex ex, std::string path, bool recursive) {
  std::string request = EncodeRequest(protocol::DeleteRequest{std::move(path), recursive});
  auto r = co_await Unary<protocol::OkReply>(ex, std::move(request), "delete reply",
                                             kFileCallTimeout);
  co_return r.status();
}

AgentClient::Call<FileEntry> AgentClient::Move(Ex ex, MoveRequest request) {
  std::string encoded = EncodeRequest(request);
  co_return co_await EntryCall(ex, std::move(encoded), "move reply");
}

AgentClient::Call<DownloadStream> AgentClient::Read(Ex ex, ReadRequest request) {
  std::string encoded = EncodeRequest(request);
  auto opened = co_await OpenStream<protocol::ReadReply>(ex, std::move(encoded), "read reply");
  if (!opened.ok()) co_return opened.status();
  co_return DownloadStream(std::move(opened->first), std::move(opened->second));
}

AgentClient::Call<UploadStream> AgentClient::Write(Ex ex, WriteRequest request) {
  std::string encoded = EncodeRequest(request);
  auto opened = co_await OpenStream<protocol::OkReply>(ex, std::move(encoded), "write reply");
  if (!opened.ok()) co_return opened.status();
  co_return UploadStream(std::move(opened->first), request.tar);
}

AgentClient::Call<WatchStream> AgentClient::Watch(Ex ex, WatchRequest request) {
  std::string encoded = EncodeRequest(request);
  auto opened = co_await OpenStream<protocol::OkReply>(ex, std::move(encoded), "watch reply");
  if (!opened.ok()) co_return opened.status();
  co_return WatchStream(std::move(opened->first));
}

// ---- streams ----------------------------------------------------------------------------

absl::StatusOr<AttachEvent> AttachFrame::Decode() const {
  AttachEvent ev;
  const std::string_view payload = this->payload();
  switch (type()) {
    case FrameType::kOutput: {
      SBX_ASSIGN_OR_RETURN(ev.output, protocol::DecodeOutputView(payload));
      ev.kind = AttachEvent::Kind::kOutput;
      break;
    }
    case FrameType::kResync: {
      SBX_ASSIGN_OR_RETURN(ev.resync, protocol::DecodeResync(payload));
      ev.kind = AttachEvent::Kind::kResync;
      break;
    }
    case FrameType::kExit: {
      SBX_ASSIGN_OR_RETURN(ev.exit, protocol::DecodeExit(payload));
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

asio::awaitable<std::optional<SessionExit>> AttachStream::ExitWithin(
    std::chrono::milliseconds wait, size_t max_payload) {
  primed_status_ = co_await s_->NextViews(wait, max_payload, views_);
  primed_ = true;
  if (!primed_status_.ok()) co_return std::nullopt;
  for (const AgentStream::FrameView& v : views_) {
    auto ev = AttachFrame(v).Decode();
    if (!ev.ok()) co_return std::nullopt;  // the relay stops here, before any exit
    if (ev->kind == AttachEvent::Kind::kExit) co_return ev->exit;
  }
  co_return std::nullopt;
}

asio::awaitable<absl::Status> AttachStream::NextBatch(std::chrono::milliseconds idle,
                                                      size_t max_payload,
                                                      std::vector<AttachFrame>& out) {
  out.clear();
  if (primed_) {
    primed_ = false;
    if (!primed_status_.ok()) co_return std::exchange(primed_status_, absl::OkStatus());
    if (!views_.empty()) {
      for (const AgentStream::FrameView& v : views_) out.emplace_back(v);
      co_return absl::OkStatus();
    }
    // ExitWithin's wait ran out with nothing: this one waits as asked.
  }
  absl::Status st = co_await s_->NextViews(idle, max_payload, views_);
  if (!st.ok()) co_return st;
  for (const AgentStream::FrameView& v : views_) out.emplace_back(v);
  co_return absl::OkStatus();
}

std::optional<AttachFrame> AttachStream::TryNext() {
  auto f = s_->TryNext();
  if (!f) return std::nullopt;
  return AttachFrame(std::move(*f));
}

namespace {

// The next frame of a transfer. A transfer may idle for kTransferIdlePeriods periods of
// kTransferIdle in all: `idle` counts them across the calls of one loop.
asio::awaitable<absl::StatusOr<Frame>> NextTransferFrame(AgentStream& s, int& idle,
                                                         const char* too_late) {
  while (idle < kTransferIdlePeriods) {
    auto f = co_await s.Next(kTransferIdle);
    if (!f.ok()) co_return f.status();
    if (*f) co_return std::move(**f);
    ++idle;
  }
  co_return absl::DeadlineExceededError(too_late);
}

}  // namespace

asio::awaitable<absl::StatusOr<std::optional<std::string>>> DownloadStream::NextChunk() {
  int idle = 0;
  auto f = co_await NextTransferFrame(*s_, idle, "the agent sent nothing in time");
  if (!f.ok()) co_return f.status();
  if (f->type == FrameType::kData) co_return std::optional<std::string>(std::move(f->payload));
  if (f->type != FrameType::kEnd) co_return Malformed("expected data or the end of a download");
  auto end = DecodeReply<protocol::OkReply>(f->payload, "end frame");
  if (!end.ok()) co_return end.status();
  co_return std::optional<std::string>();
}

asio::awaitable<absl::StatusOr<UploadStream::Result>> UploadStream::ReadEnd() {
  int idle = 0;
  for (;;) {
    auto f = co_await NextTransferFrame(*s_, idle, "the agent did not finish the transfer in time");
    if (!f.ok()) co_return f.status();
    if (f->type == FrameType::kData) continue;
    if (f->type != FrameType::kEnd) {
      co_return absl::InternalError("agent protocol: expected the end of a file transfer");
    }
    Result r;
    if (tar_) {
      auto end = DecodeReply<protocol::WriteTarEnd>(f->payload, "end frame");
      if (!end.ok()) co_return end.status();
      r.tar = *end;
    } else {
      auto end = DecodeReply<protocol::EntryReply>(f->payload, "end frame");
      if (!end.ok()) co_return end.status();
      r.entry = std::move(end->entry);
    }
    co_return r;
  }
}

asio::awaitable<absl::Status> UploadStream::Send(std::string_view chunk) {
  std::string frame = protocol::EncodeFrame(FrameType::kData, chunk);
  auto sent = co_await s_->Send(std::move(frame), kTransferIdle * kTransferIdlePeriods);
  if (sent.ok()) co_return sent;
  // The agent stopped reading: it failed (disk full, too large) and said why.
  auto end = co_await ReadEnd();
  s_->Close();
  co_return end.ok() ? sent : end.status();
}

asio::awaitable<absl::StatusOr<UploadStream::Result>> UploadStream::Finish() {
  std::string frame = protocol::EncodeFrame(FrameType::kEnd, "{}");
  auto sent = co_await s_->Send(std::move(frame), kTransferIdle * kTransferIdlePeriods);
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
