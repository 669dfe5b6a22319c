#include "service/agent_transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace sbx::service {
namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

class UnixStream final : public AgentByteStream {
 public:
  explicit UnixStream(asio::any_io_executor ex) : socket_(std::move(ex)) {}
  asio::local::stream_protocol::socket& socket() { return socket_; }

  asio::awaitable<std::pair<boost::system::error_code, size_t>> ReadSome(
      asio::mutable_buffer buf) override {
    auto [ec, n] = co_await socket_.async_read_some(buf, kTuple);
    co_return std::make_pair(ec, n);
  }
  asio::awaitable<boost::system::error_code> WriteAll(asio::const_buffer buf) override {
    auto [ec, n] = co_await asio::async_write(socket_, buf, kTuple);
    co_return ec;
  }
  void Cancel() override {
    boost::system::error_code ignored;
    socket_.cancel(ignored);
  }
  void Close() override {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  asio::local::stream_protocol::socket socket_;
};

}  // namespace

asio::awaitable<absl::StatusOr<std::unique_ptr<AgentByteStream>>> UnixSocketTransport::Open(
    asio::any_io_executor ex) {
  auto s = std::make_unique<UnixStream>(ex);
  // Made here, close-on-exec (asio's own open would make it without): a program sbxd starts
  // must not inherit a connection to an agent.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    co_return absl::UnavailableError(fmt::format("connect to agent ({}): socket(AF_UNIX): {}",
                                                 path_, std::strerror(err)));
  }
  boost::system::error_code aec;
  s->socket().assign(asio::local::stream_protocol(), fd, aec);
  if (aec) {
    ::close(fd);
    co_return absl::UnavailableError(fmt::format("connect to agent ({}): {}", path_, aec.message()));
  }
  auto [ec] = co_await s->socket().async_connect(asio::local::stream_protocol::endpoint(path_),
                                                 kTuple);
  if (ec) {
    co_return absl::UnavailableError(fmt::format("connect to agent ({}): {}", path_, ec.message()));
  }
  co_return std::unique_ptr<AgentByteStream>(std::move(s));
}

}  // namespace sbx::service
