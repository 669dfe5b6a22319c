// The agent protocol's framing (protocol/protocol.h) over one byte stream of an
// AgentTransport, asynchronous on the caller's executor: the data plane must never block an io
// thread on a slow or frozen sandbox. Used only by the agent client (service/agent_client.h),
// which turns its frames into typed replies, events and chunks.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio.hpp>

#include "absl/status/statusor.h"
#include "protocol/protocol.h"
#include "service/agent_transport.h"

namespace sbx::service {

class AgentStream {
 public:
  // Opens a stream, sends hello + `request` (an encoded request payload), and reads the
  // agent's hello and response, all within `timeout`. The response payload is kept as the
  // agent sent it (response_payload()): the caller decodes it as the reply type it expects.
  // `guest_sized`: the response may be up to kMaxGuestReplyBytes ("processes", "list"), else
  // every frame is held to its small bound (protocol/limits.h).
  static asio::awaitable<absl::StatusOr<std::unique_ptr<AgentStream>>> Open(
      asio::any_io_executor ex, AgentTransport& transport, std::string request,
      std::chrono::milliseconds timeout, bool guest_sized = false);

  AgentStream(asio::any_io_executor ex, std::unique_ptr<AgentByteStream> bytes)
      : bytes_(std::move(bytes)),
        timer_(ex),
        state_(std::make_shared<State>(State{0, false, bytes_.get()})) {}
  ~AgentStream();

  // The read buffer of kReadBytes a stream takes at its start: this thread's spare when it has
  // one, else a new one; GiveBackReadBuffer keeps one as the spare (the destructor's).
  static std::unique_ptr<char[]> TakeReadBuffer();
  static void GiveBackReadBuffer(std::unique_ptr<char[]> buf);

  std::string& response_payload() { return response_; }
  // The next frame; nullopt when nothing arrived within `idle` (the caller may send a
  // keep-alive and call again; no bytes are lost). Unavailable when the agent closed.
  //
  // Pause: a frozen agent sends nothing but keeps its end of the stream open, so a stream that
  // is open when the sandbox is paused just sees idle periods here (never an error) for as
  // long as the pause lasts; the agent's output resumes, from where it stopped, after wake.
  // Only Open()'s `timeout` is a hard deadline, and sbxd does not open new agent
  // connections to a frozen sandbox (SandboxService::AgentSocketFor).
  asio::awaitable<absl::StatusOr<std::optional<protocol::Frame>>> Next(
      std::chrono::milliseconds idle);
  // A frame that already arrived with an earlier read, without waiting: lets the caller batch
  // what the agent sent together. nullopt when no complete frame is buffered, and also when
  // the buffered bytes are malformed (the next Next() then reports that error).
  std::optional<protocol::Frame> TryNext();
  // A frame of NextViews: its payload points into the stream's read buffer.
  struct FrameView {
    protocol::FrameType type;
    std::string_view payload;
  };
  // Attach's bulk path: waits up to `idle` for at least one whole frame, then hands out every
  // whole frame already read (up to about `max_payload` bytes of payload) as views into the
  // stream's own buffer, which the agent's bytes are read into directly and which is reused
  // from call to call. The views stay valid until the next call of NextViews (never mix with
  // Next/TryNext on one stream). `out` empty and OkStatus: nothing arrived within `idle`.
  // Per 1 GiB of output this saves the copy into the decoder, the copy out of it, and the
  // fresh (page-faulted) allocation each large frame cost (issue 15's attach profile).
  asio::awaitable<absl::Status> NextViews(std::chrono::milliseconds idle, size_t max_payload,
                                          std::vector<FrameView>& out);
  // Writes bytes (encoded frames) to the agent: file uploads. Waits while the agent is slow
  // (back-pressure), up to `timeout`.
  asio::awaitable<absl::Status> Send(std::string bytes, std::chrono::milliseconds timeout);
  void Close();

 private:
  // Cancels the stream's pending operation (state_->timed_out set) unless it completes within
  // `deadline`; a generation counter keeps a late timer from cancelling a later operation.
  void ArmDeadline(std::chrono::milliseconds deadline);
  asio::awaitable<absl::Status> ReadUntilFrame(std::optional<protocol::Frame>& out,
                                               std::chrono::milliseconds deadline,
                                               bool idle_ok);

  struct State {
    uint64_t gen;
    bool timed_out;
    AgentByteStream* bytes;
  };

  std::unique_ptr<AgentByteStream> bytes_;
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
  uint64_t read_gen_ = 0;
  protocol::FrameDecoder decoder_;
  std::string response_;
  // Not zero-filled: zeroing (and faulting in) 256 KiB per agent call was 8-25% of sbxd's CPU
  // time per exec (perf, issue 15); a read touches only the pages it fills. Taken from, and
  // given back to, a spare kept per thread (agent_stream.cc): at sbxd's mmap threshold a
  // buffer of this size is an mmap and a munmap (with its TLB shootdown across sbxd's threads)
  // per agent call otherwise. Only the `n` bytes a read returned are ever looked at, so what a
  // spare held before (another sandbox's bytes) is never seen.
  static constexpr size_t kReadBytes = 256 << 10;
  std::unique_ptr<char[]> buf_ = TakeReadBuffer();
  // NextViews' buffer: the unread bytes are [vpos_, vend_); grown on demand, never shrunk.
  std::string vbuf_;
  size_t vpos_ = 0;
  size_t vend_ = 0;
  size_t vread_ = 0;    // bytes the next read asks for (see kViewReadMin)
  bool views_ = false;  // the decoder's leftover bytes have moved to vbuf_
};

}  // namespace sbx::service
