#include "service/agent_stream.h"

#include <fmt/format.h>

#include "common/status_util.h"
#include "protocol/guest_reply.h"
#include "protocol/limits.h"

namespace sbx::service {
namespace {
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

absl::Status AgentError(const nlohmann::json& resp);
}  // namespace

absl::Status AgentErrorStatus(const nlohmann::json& resp) { return AgentError(resp); }

namespace {
using protocol::StringField;

// The agent is on the guest's side of the boundary: a field of another type is ignored.
absl::Status AgentError(const nlohmann::json& resp) {
  std::string code, message, reason;
  auto err = resp.find("error");
  if (err != resp.end() && err->is_object()) {
    code = StringField(*err, "code");
    message = StringField(*err, "message");
    reason = StringField(*err, "reason");
  }
  return protocol::AgentErrorFromFields(code, message, reason);
}
}  // namespace

void AgentStream::ArmDeadline(std::chrono::milliseconds deadline) {
  const uint64_t gen = ++read_gen_;
  timer_.expires_after(deadline);
  timer_.async_wait([weak = std::weak_ptr<State>(state_), gen](boost::system::error_code ec) {
    auto st = weak.lock();
    if (ec || !st || st->gen != gen) return;
    st->timed_out = true;
    boost::system::error_code ignored;
    st->socket->cancel(ignored);
  });
  state_->gen = gen;
  state_->timed_out = false;
}

asio::awaitable<absl::Status> AgentStream::ReadUntilFrame(std::optional<protocol::Frame>& out,
                                                          std::chrono::milliseconds deadline,
                                                          bool idle_ok) {
  for (;;) {
    auto next = decoder_.Next();
    if (!next.ok()) co_return Annotate(next.status(), "agent protocol");
    if (*next) {
      out = std::move(**next);
      co_return absl::OkStatus();
    }
    // Cancelling a pending read_some loses no bytes: either the read completed (and its
    // handler runs with the data) or it had not started transferring. A timer completion that
    // was already queued when the read finished must not cancel a later read: the generation
    // counter tells them apart, and the weak pointer keeps it from touching a dead stream.
    ArmDeadline(deadline);
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf_), kTuple);
    state_->gen = 0;
    timer_.cancel();
    if (ec == asio::error::operation_aborted && state_->timed_out) {
      // Idle is not failure: a paused (frozen) sandbox is idle for as long as the pause lasts.
      if (idle_ok) co_return absl::OkStatus();  // out stays empty: idle
      co_return absl::DeadlineExceededError("agent did not answer in time");
    }
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      co_return absl::UnavailableError("agent closed the stream");
    }
    if (ec) co_return absl::UnavailableError(fmt::format("agent read: {}", ec.message()));
    decoder_.Feed(std::string_view(buf_.data(), n));
  }
}

asio::awaitable<absl::StatusOr<std::unique_ptr<AgentStream>>> AgentStream::Open(
    asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
    std::chrono::milliseconds timeout) {
  return OpenImpl(std::move(ex), std::move(socket_path), std::move(request), timeout,
                  /*guest_sized=*/false);
}

asio::awaitable<absl::StatusOr<std::unique_ptr<AgentStream>>> AgentStream::OpenImpl(
    asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
    std::chrono::milliseconds timeout, bool guest_sized) {
  auto s = std::make_unique<AgentStream>(ex);
  s->decoder_.LimitToAgentBounds(guest_sized);
  auto [cec] = co_await s->socket_.async_connect(
      asio::local::stream_protocol::endpoint(socket_path), kTuple);
  if (cec) {
    co_return absl::UnavailableError(
        fmt::format("connect to agent ({}): {}", socket_path, cec.message()));
  }
  std::string out = protocol::EncodeFrame(
      protocol::FrameType::kHello,
      nlohmann::json{{"version", protocol::kVersion}, {"role", "host"}}.dump());
  out += protocol::EncodeFrame(protocol::FrameType::kRequest, request.dump());
  auto [wec, wn] = co_await asio::async_write(s->socket_, asio::buffer(out), kTuple);
  if (wec) co_return absl::UnavailableError(fmt::format("write to agent: {}", wec.message()));

  bool got_hello = false;
  for (;;) {
    std::optional<protocol::Frame> f;
    absl::Status st = co_await s->ReadUntilFrame(f, timeout, /*idle_ok=*/false);
    if (!st.ok()) co_return st;
    if (f->type == protocol::FrameType::kHello) {
      got_hello = true;
      continue;
    }
    if (f->type != protocol::FrameType::kResponse || !got_hello) {
      co_return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                         "agent protocol: expected hello then response");
    }
    if (guest_sized) {
      // Not parsed here: RewriteGuestList reads it without building a tree.
      s->raw_response_ = std::move(f->payload);
      co_return s;
    }
    // Depth-checked: handlers forward and log parts of the response (files, processes).
    auto resp = protocol::ParseObjectPayload(f->payload, "agent response");
    if (!resp.ok()) {
      co_return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                         fmt::format("agent protocol: {}", std::string(resp.status().message())));
    }
    if (!protocol::ResponseOk(*resp)) co_return AgentError(*resp);
    s->response_ = std::move(*resp);
    co_return s;
  }
}

asio::awaitable<absl::StatusOr<std::optional<protocol::Frame>>> AgentStream::Next(
    std::chrono::milliseconds idle) {
  std::optional<protocol::Frame> f;
  absl::Status st = co_await ReadUntilFrame(f, idle, /*idle_ok=*/true);
  if (!st.ok()) co_return st;
  co_return f;
}

std::optional<protocol::Frame> AgentStream::TryNext() {
  auto next = decoder_.Next();
  if (!next.ok() || !*next) return std::nullopt;
  return std::move(**next);
}

asio::awaitable<absl::Status> AgentStream::Send(std::string bytes,
                                                std::chrono::milliseconds timeout) {
  ArmDeadline(timeout);
  auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(bytes), kTuple);
  state_->gen = 0;
  timer_.cancel();
  if (ec == asio::error::operation_aborted && state_->timed_out) {
    co_return absl::DeadlineExceededError("agent did not take the data in time");
  }
  if (ec) co_return absl::UnavailableError(fmt::format("write to agent: {}", ec.message()));
  co_return absl::OkStatus();
}

void AgentStream::Close() {
  boost::system::error_code ec;
  timer_.cancel();
  socket_.close(ec);
}

asio::awaitable<absl::StatusOr<nlohmann::json>> AsyncCallAgent(asio::any_io_executor ex,
                                                              std::string socket_path,
                                                              nlohmann::json request,
                                                              std::chrono::milliseconds timeout) {
  auto s = co_await AgentStream::Open(ex, std::move(socket_path), std::move(request), timeout);
  if (!s.ok()) co_return s.status();
  nlohmann::json resp = (*s)->response();
  (*s)->Close();
  co_return resp;
}

asio::awaitable<absl::StatusOr<std::string>> AsyncCallAgentGuestSized(
    asio::any_io_executor ex, std::string socket_path, nlohmann::json request,
    std::chrono::milliseconds timeout) {
  auto s = co_await AgentStream::OpenImpl(ex, std::move(socket_path), std::move(request),
                                          timeout, /*guest_sized=*/true);
  if (!s.ok()) co_return s.status();
  std::string payload = std::move((*s)->raw_response_);
  (*s)->Close();
  co_return payload;
}

}  // namespace sbx::service
