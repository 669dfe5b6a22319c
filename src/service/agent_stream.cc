#include "service/agent_stream.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"
#include "protocol/limits.h"
#include "protocol/messages.h"

namespace sbx::service {
namespace {

// One read buffer per thread that has run an agent call, kept between calls; bounded to one,
// so sbxd holds at most kReadBytes per thread for this.
thread_local std::unique_ptr<char[]> spare_read_buffer;

}  // namespace

std::unique_ptr<char[]> AgentStream::TakeReadBuffer() {
  if (spare_read_buffer) return std::move(spare_read_buffer);
  return std::make_unique_for_overwrite<char[]>(kReadBytes);
}

void AgentStream::GiveBackReadBuffer(std::unique_ptr<char[]> buf) {
  if (buf && !spare_read_buffer) spare_read_buffer = std::move(buf);
}

AgentStream::~AgentStream() { GiveBackReadBuffer(std::move(buf_)); }

void AgentStream::ArmDeadline(std::chrono::milliseconds deadline) {
  const uint64_t gen = ++read_gen_;
  timer_.expires_after(deadline);
  timer_.async_wait([weak = std::weak_ptr<State>(state_), gen](boost::system::error_code ec) {
    auto st = weak.lock();
    if (ec || !st || st->gen != gen) return;
    st->timed_out = true;
    st->bytes->Cancel();
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
    // Cancelling a pending read loses no bytes: either the read completed (and its handler
    // runs with the data) or it had not started transferring. A timer completion that was
    // already queued when the read finished must not cancel a later read: the generation
    // counter tells them apart, and the weak pointer keeps it from touching a dead stream.
    // Armed already (gen is non-zero only while a deadline runs): Open's one deadline.
    // Its timer may have fired while no read was pending (after the last one completed):
    // nothing was cancelled then, so look.
    const bool armed = state_->gen != 0;
    if (armed && state_->timed_out) {
      co_return absl::DeadlineExceededError("agent did not answer in time");
    }
    if (!armed) ArmDeadline(deadline);
    auto [ec, n] = co_await bytes_->ReadSome(asio::buffer(buf_.get(), kReadBytes));
    if (!armed) {
      state_->gen = 0;
      timer_.cancel();
    }
    if (ec == asio::error::operation_aborted && state_->timed_out) {
      // Idle is not failure: a paused (frozen) sandbox is idle for as long as the pause lasts.
      if (idle_ok) co_return absl::OkStatus();  // out stays empty: idle
      co_return absl::DeadlineExceededError("agent did not answer in time");
    }
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      co_return absl::UnavailableError("agent closed the stream");
    }
    if (ec) co_return absl::UnavailableError(fmt::format("agent read: {}", ec.message()));
    decoder_.Feed(std::string_view(buf_.get(), n));
  }
}

asio::awaitable<absl::StatusOr<std::unique_ptr<AgentStream>>> AgentStream::Open(
    asio::any_io_executor ex, AgentTransport& transport, std::string request,
    std::chrono::milliseconds timeout, bool guest_sized) {
  auto bytes = co_await transport.Open(ex);
  if (!bytes.ok()) co_return bytes.status();
  auto s = std::make_unique<AgentStream>(ex, std::move(*bytes));
  s->decoder_.LimitToAgentBounds(guest_sized);
  std::string out = protocol::EncodeFrame(
      protocol::FrameType::kHello,
      protocol::DumpJson(protocol::Json{{"version", protocol::kVersion}, {"role", "host"}}));
  out += protocol::EncodeFrame(protocol::FrameType::kRequest, request);
  // One deadline for the write and every read up to the response (one timer, and so one
  // timerfd_settime, per call instead of one per step).
  s->ArmDeadline(timeout);
  auto disarm = [&s] {
    s->state_->gen = 0;
    s->timer_.cancel();
  };
  auto wec = co_await s->bytes_->WriteAll(asio::buffer(out));
  if (wec) {
    disarm();
    co_return absl::UnavailableError(fmt::format("write to agent: {}", wec.message()));
  }

  bool got_hello = false;
  for (;;) {
    std::optional<protocol::Frame> f;
    absl::Status st = co_await s->ReadUntilFrame(f, timeout, /*idle_ok=*/false);
    if (!st.ok()) {
      disarm();
      co_return st;
    }
    if (f->type == protocol::FrameType::kHello) {
      got_hello = true;
      continue;
    }
    disarm();
    if (f->type != protocol::FrameType::kResponse || !got_hello) {
      co_return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                         "agent protocol: expected hello then response");
    }
    s->response_ = std::move(f->payload);
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

namespace {

// What one read of NextViews asks for: it starts small (an idle or chatty session holds
// little) and doubles while reads fill it, up to several large frames per read when busy.
constexpr size_t kViewReadMin = 16 << 10;
constexpr size_t kViewReadMax = 512 << 10;

}  // namespace

asio::awaitable<absl::Status> AgentStream::NextViews(std::chrono::milliseconds idle,
                                                     size_t max_payload,
                                                     std::vector<FrameView>& out) {
  out.clear();
  if (!views_) {
    views_ = true;
    vbuf_ = decoder_.TakeBuffered();
    vpos_ = 0;
    vend_ = vbuf_.size();
  }
  for (;;) {
    // Every whole frame already read, up to `max_payload` (the first one whatever its size).
    size_t taken = 0;
    size_t need = 0;  // bytes the next, partial frame needs in all
    while (vend_ - vpos_ >= protocol::kHeaderSize && (out.empty() || taken < max_payload)) {
      const auto* header = reinterpret_cast<const uint8_t*>(vbuf_.data() + vpos_);
      auto type_and_length = protocol::DecodeHeader(header);
      // A bad frame after good ones: those go out first; the next call reports it (vpos_
      // stays on it), as Next after TryNext did.
      if (!type_and_length.ok() && !out.empty()) break;
      if (!type_and_length.ok()) co_return Annotate(type_and_length.status(), "agent protocol");
      const auto [type, length] = *type_and_length;
      // The same bounds as the decoder's (Open set them): checked on the header, before any
      // of the payload is buffered.
      if (decoder_.limited_to_agent_bounds() &&
          length > protocol::MaxFrameBytes(type, decoder_.guest_sized_response())) {
        if (!out.empty()) break;
        co_return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                           fmt::format("agent protocol: a frame of type {} with {} payload "
                                       "bytes exceeds its limit of {}",
                                       static_cast<int>(type), length,
                                       protocol::MaxFrameBytes(
                                           type, decoder_.guest_sized_response())));
      }
      const size_t total = protocol::kHeaderSize + length;
      if (vend_ - vpos_ < total) {
        need = total;
        break;
      }
      out.push_back(FrameView{type, std::string_view(vbuf_.data() + vpos_ + protocol::kHeaderSize,
                                                     length)});
      taken += length;
      vpos_ += total;
    }
    if (!out.empty()) co_return absl::OkStatus();
    // Nothing whole yet: move the partial frame to the front (no view is out now) and make
    // room for the rest of it and one more read.
    if (vpos_ > 0) {
      std::memmove(vbuf_.data(), vbuf_.data() + vpos_, vend_ - vpos_);
      vend_ -= vpos_;
      vpos_ = 0;
    }
    if (vread_ == 0) vread_ = kViewReadMin;
    const size_t want = std::max(need, vend_ + vread_);
    if (vbuf_.size() < want) vbuf_.resize(want);
    const size_t room = vbuf_.size() - vend_;
    ArmDeadline(idle);
    auto [ec, n] = co_await bytes_->ReadSome(asio::buffer(vbuf_.data() + vend_, room));
    state_->gen = 0;
    timer_.cancel();
    if (ec == asio::error::operation_aborted && state_->timed_out) co_return absl::OkStatus();
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      co_return absl::UnavailableError("agent closed the stream");
    }
    if (ec) co_return absl::UnavailableError(fmt::format("agent read: {}", ec.message()));
    vend_ += n;
    if (n == room && vread_ < kViewReadMax) vread_ *= 2;
  }
}

asio::awaitable<absl::Status> AgentStream::Send(std::string bytes,
                                                std::chrono::milliseconds timeout) {
  ArmDeadline(timeout);
  auto ec = co_await bytes_->WriteAll(asio::buffer(bytes));
  state_->gen = 0;
  timer_.cancel();
  if (ec == asio::error::operation_aborted && state_->timed_out) {
    co_return absl::DeadlineExceededError("agent did not take the data in time");
  }
  if (ec) co_return absl::UnavailableError(fmt::format("write to agent: {}", ec.message()));
  co_return absl::OkStatus();
}

void AgentStream::Close() {
  timer_.cancel();
  bytes_->Close();
}

}  // namespace sbx::service
