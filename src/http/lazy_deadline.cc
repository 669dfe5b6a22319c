#include "http/lazy_deadline.h"

#include <utility>

namespace sbx::http {

struct LazyDeadline::State {
  State(const boost::asio::any_io_executor& ex, std::function<void()> f)
      : timer(ex), on_expiry(std::move(f)) {}
  boost::asio::steady_timer timer;
  std::function<void()> on_expiry;  // not called once `gone`
  Clock::time_point due = Clock::time_point::max();
  // When the pending wait fires; max: no wait is pending.
  Clock::time_point armed = Clock::time_point::max();
  // Which wait is the current one: a re-arm leaves the old wait's handler to run (aborted, or
  // already completed and queued), and it must then do nothing.
  uint64_t generation = 0;
  bool expired = false;
  bool gone = false;
};

LazyDeadline::LazyDeadline(const boost::asio::any_io_executor& ex,
                           std::function<void()> on_expiry)
    : st_(std::make_shared<State>(ex, std::move(on_expiry))) {}

LazyDeadline::~LazyDeadline() {
  st_->gone = true;
  st_->timer.cancel();
}

void LazyDeadline::ExpiresAt(Clock::time_point due) {
  st_->due = due;
  st_->expired = false;
  // A later due time than the pending wait's is seen when that wait fires.
  if (due < st_->armed) Arm(st_, due);
}

void LazyDeadline::Never() {
  st_->due = Clock::time_point::max();
  st_->expired = false;
}

LazyDeadline::Clock::time_point LazyDeadline::expiry() const { return st_->due; }

bool LazyDeadline::expired() const { return st_->expired; }

void LazyDeadline::Arm(const std::shared_ptr<State>& st, Clock::time_point at) {
  const uint64_t gen = ++st->generation;
  st->armed = at;
  st->timer.expires_at(at);
  st->timer.async_wait([st, gen](const boost::system::error_code& ec) {
    if (st->gone || gen != st->generation) return;
    st->armed = Clock::time_point::max();
    if (ec || st->due == Clock::time_point::max()) return;
    if (Clock::now() < st->due) {
      Arm(st, st->due);
      return;
    }
    st->expired = true;
    st->on_expiry();
  });
}

}  // namespace sbx::http
