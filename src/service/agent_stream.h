// Asynchronous sbxd side of the agent protocol (src/protocol/protocol.h), on the caller's
// executor, for the data plane: attach streams and short status calls from HTTP handlers
// must never block an io thread on a slow or frozen sandbox.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "protocol/protocol.h"

namespace sbx::service {

namespace asio = boost::asio;

class AgentStream {
 public:
  // Connects, sends hello + request, and reads the agent's hello and response, all within
  // `timeout`. An "ok":false response becomes an error status.
  static asio::awaitable<absl::StatusOr<std::unique_ptr<AgentStream>>> Open(
      asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
      std::chrono::milliseconds timeout = std::chrono::seconds(10));

  explicit AgentStream(asio::any_io_executor ex)
      : socket_(ex), timer_(ex), state_(std::make_shared<State>(State{0, false, &socket_})) {}

  const nlohmann::json& response() const { return response_; }
  // The next frame; nullopt when nothing arrived within `idle` (the caller may send a
  // keep-alive and call again; no bytes are lost). Unavailable when the agent closed.
  //
  // Pause: a frozen agent sends nothing but keeps its end of the socket open, so a stream that
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
  // Writes bytes (encoded frames) to the agent: file uploads. Waits while the agent is slow
  // (back-pressure), up to `timeout`.
  asio::awaitable<absl::Status> Send(std::string bytes, std::chrono::milliseconds timeout);
  void Close();

 private:
  // Cancels the socket's pending operation (state_->timed_out set) unless it completes within
  // `deadline`; a generation counter keeps a late timer from cancelling a later operation.
  void ArmDeadline(std::chrono::milliseconds deadline);
  asio::awaitable<absl::Status> ReadUntilFrame(std::optional<protocol::Frame>& out,
                                               std::chrono::milliseconds deadline,
                                               bool idle_ok);

  friend asio::awaitable<absl::StatusOr<std::string>> AsyncCallAgentGuestSized(
      asio::any_io_executor, std::string, nlohmann::json, std::chrono::milliseconds);
  static asio::awaitable<absl::StatusOr<std::unique_ptr<AgentStream>>> OpenImpl(
      asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
      std::chrono::milliseconds timeout, bool guest_sized);

  struct State {
    uint64_t gen;
    bool timed_out;
    asio::local::stream_protocol::socket* socket;
  };

  asio::local::stream_protocol::socket socket_;
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
  uint64_t read_gen_ = 0;
  protocol::FrameDecoder decoder_;
  nlohmann::json response_;
  std::string raw_response_;  // guest-sized calls only
  std::string buf_ = std::string(256 << 10, '\0');
};

// The error status of an agent's {"ok":false,"error":{"code","message"[,"reason"]}}: the
// canonical code from "code", the API code from "reason" when present (file operations).
absl::Status AgentErrorStatus(const nlohmann::json& resp);

// One request on a fresh connection (status, signal, ping).
asio::awaitable<absl::StatusOr<nlohmann::json>> AsyncCallAgent(
    asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
    std::chrono::milliseconds timeout = std::chrono::seconds(5));

// A guest-sized request ("processes", "list": protocol/limits.h IsGuestSizedOp) on a fresh
// connection: the response payload as the agent sent it (up to kMaxGuestReplyBytes, refused
// beyond on the frame header), unparsed, for protocol::RewriteGuestList. Every other call's
// response is held to kMaxSmallResponseBytes.
asio::awaitable<absl::StatusOr<std::string>> AsyncCallAgentGuestSized(
    asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
    std::chrono::milliseconds timeout);

}  // namespace sbx::service
