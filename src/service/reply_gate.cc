#include "service/reply_gate.h"

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::service {

namespace asio = boost::asio;

ReplyGate::Slot& ReplyGate::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    if (gate_) gate_->Release(id_);
    gate_ = std::exchange(o.gate_, nullptr);
    id_ = std::move(o.id_);
  }
  return *this;
}

ReplyGate::Slot::~Slot() {
  if (gate_) gate_->Release(id_);
}

size_t ReplyGate::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

asio::awaitable<absl::StatusOr<ReplyGate::Slot>> ReplyGate::Acquire(asio::any_io_executor ex,
                                                                    std::string sandbox_id) {
  std::shared_ptr<Waiter> waiter;
  {
    std::lock_guard lock(mu_);
    PerSandbox& s = sandboxes_[sandbox_id];
    if (s.held < settings_.per_sandbox && s.waiting.empty()) {
      if (in_flight_ >= settings_.in_flight) {
        if (s.held == 0 && s.waiting.empty()) sandboxes_.erase(sandbox_id);
        co_return ApiError(absl::StatusCode::kUnavailable, "server_busy",
                           fmt::format("sbxd is already sending {} process or file listings; "
                                       "retry in a moment",
                                       settings_.in_flight));
      }
      ++s.held;
      ++in_flight_;
      co_return Slot(this, std::move(sandbox_id));
    }
    if (s.waiting.size() >= settings_.queue_per_sandbox) {
      co_return ApiError(absl::StatusCode::kResourceExhausted, "too_many_requests",
                         fmt::format("sandbox {} already has {} process or file listings in "
                                     "flight and {} waiting; retry once they are done",
                                     sandbox_id, s.held, s.waiting.size()));
    }
    waiter = std::make_shared<Waiter>(ex);
    waiter->timer.expires_after(settings_.max_wait);
    s.waiting.push_back(waiter);
  }
  boost::system::error_code ec;
  co_await waiter->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  std::lock_guard lock(mu_);
  if (waiter->granted) co_return Slot(this, std::move(sandbox_id));
  PerSandbox& s = sandboxes_[sandbox_id];
  std::erase(s.waiting, waiter);
  co_return ApiError(absl::StatusCode::kResourceExhausted, "too_many_requests",
                     fmt::format("sandbox {}: no process or file listing finished within {} ms; "
                                 "retry later",
                                 sandbox_id, settings_.max_wait.count()));
}

void ReplyGate::Release(const std::string& sandbox_id) {
  std::shared_ptr<Waiter> next;
  {
    std::lock_guard lock(mu_);
    auto it = sandboxes_.find(sandbox_id);
    if (it == sandboxes_.end()) return;
    PerSandbox& s = it->second;
    if (!s.waiting.empty()) {
      // The slot passes to the first waiter as it is: held and in_flight stay the same.
      next = std::move(s.waiting.front());
      s.waiting.pop_front();
      next->granted = true;
    } else {
      --s.held;
      --in_flight_;
      if (s.held == 0) sandboxes_.erase(it);
    }
  }
  if (next) {
    // The timer belongs to the waiter's executor: cancel it there, not from this thread.
    asio::post(next->timer.get_executor(), [next] { next->timer.cancel(); });
  }
}

}  // namespace sbx::service
