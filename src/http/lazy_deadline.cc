#include "http/read_deadline.h"

#include <utility>

namespace sbx::http {

struct ReadDeadline::State {
  State(const boost::asio::any_io_executor& ex, boost::asio::ip::tcp::socket& s)
      : timer(ex), socket(&s) {}
  boost::asio::steady_timer timer;
  boost::asio::ip::tcp::socket* socket;  // not used once `gone`
  Clock::time_point due = Clock::time_point::max();
  // When the pending wait fires; max: no wait is pending.
  Clock::time_point armed = Clock::time_point::max();
  // Which wait is the current one: a re-arm leaves the old wait's handler to run (aborted, or
  // already completed and queued), and it must then do nothing.
  uint64_t generation = 0;
  bool expired = false;
  bool gone = false;
};

ReadDeadline::ReadDeadline(const boost::asio::any_io_executor& ex,
                           boost::asio::ip::tcp::socket& socket)
    : st_(std::make_shared<State>(ex, socket)) {}

ReadDeadline::~ReadDeadline() {
  st_->gone = true;
  st_->timer.cancel();
}

void ReadDeadline::ExpiresAt(Clock::time_point due) {
  st_->due = due;
  st_->expired = false;
  // A later due time than the pending wait's is seen when that wait fires.
  if (due < st_->armed) Arm(st_, due);
}

void ReadDeadline::Never() {
  st_->due = Clock::time_point::max();
  st_->expired = false;
}

ReadDeadline::Clock::time_point ReadDeadline::expiry() const { return st_->due; }

bool ReadDeadline::expired() const { return st_->expired; }

void ReadDeadline::Arm(const std::shared_ptr<State>& st, Clock::time_point at) {
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
    boost::system::error_code ignored;
    st->socket->cancel(ignored);
  });
}

}  // namespace sbx::http
