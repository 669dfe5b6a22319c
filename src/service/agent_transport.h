// How sbxd reaches a sandbox's agent: a transport opens byte streams to it, and each stream
// carries one request of the agent protocol (protocol/protocol.h) and what follows it. The
// agent client (service/agent_client.h) speaks the protocol over whatever this returns and is
// the only user.
//
// Two shapes of transport exist:
//   - many streams: the ns and fake runtimes' unix socket (UnixSocketTransport), and vsock for
//     a microVM: Open() makes a new connection each time;
//   - one stream per sandbox (virtio-serial): Open() returns a logical stream multiplexed on
//     the one device (protocol.h, "One byte stream"). Nothing above this interface changes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio.hpp>

#include "absl/status/statusor.h"

namespace sbx::service {

namespace asio = boost::asio;

// One duplex byte stream to an agent. Operations run on the executor the stream was opened
// on; at most one read and one write are pending at a time.
class AgentByteStream {
 public:
  virtual ~AgentByteStream() = default;
  // Some bytes into `buf`; (eof, 0) when the agent closed its end.
  virtual asio::awaitable<std::pair<boost::system::error_code, size_t>> ReadSome(
      asio::mutable_buffer buf) = 0;
  // All of `buf`, or an error.
  virtual asio::awaitable<boost::system::error_code> WriteAll(asio::const_buffer buf) = 0;
  // Makes the pending read or write complete with operation_aborted (a deadline ran out);
  // the stream stays usable.
  virtual void Cancel() = 0;
  // Closes this stream; for a multiplexed stream, only this one (the agent sees its close).
  virtual void Close() = 0;
};

class AgentTransport {
 public:
  virtual ~AgentTransport() = default;
  // A new stream to the agent; Unavailable when the agent cannot be reached.
  virtual asio::awaitable<absl::StatusOr<std::unique_ptr<AgentByteStream>>> Open(
      asio::any_io_executor ex) = 0;
  // Where the agent is, for error messages ("unix:/run/sbx/.../agent.sock").
  virtual std::string Describe() const = 0;
};

// The agent's unix socket (ns and fake runtimes): a connection per stream.
class UnixSocketTransport final : public AgentTransport {
 public:
  explicit UnixSocketTransport(std::string path) : path_(std::move(path)) {}
  asio::awaitable<absl::StatusOr<std::unique_ptr<AgentByteStream>>> Open(
      asio::any_io_executor ex) override;
  std::string Describe() const override { return "unix:" + path_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sbx::service
