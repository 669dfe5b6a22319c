// A deadline that costs nothing to move (issue 15: the per-request path), for a connection's
// header reads and for a relay's idle limit.
//
// Every request on a keep-alive connection moves its read deadline (idle, then header, then
// none while the handler runs), and every piece a relay moves pushes its idle limit. Racing
// each read against a timer (`read || timer.async_wait`) spawned two coroutines and a parallel
// group per read, and re-armed the timer each time. Here one timer is armed at most at the
// earliest due time it was asked for, and re-checked when it fires: moving the deadline later
// is a store, and the timer fires about once per idle period of a busy connection. When the
// due time passes while the deadline is set, `on_expiry` runs: the connection cancels its
// pending read (which the reader turns into a 408; the socket stays open), a relay closes its
// sockets.
//
// Not thread-safe: the owner and the timer's handler run on one strand. `on_expiry` never runs
// once this object is gone: the timer's handler, which may run later (a wait that completed
// just before the destructor's cancel), holds the shared state and sees `gone`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

namespace sbx::http {

class LazyDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  LazyDeadline(const boost::asio::any_io_executor& ex, std::function<void()> on_expiry);
  ~LazyDeadline();
  LazyDeadline(const LazyDeadline&) = delete;
  LazyDeadline& operator=(const LazyDeadline&) = delete;

  void ExpiresAt(Clock::time_point due);
  void ExpiresAfter(Clock::duration d) { ExpiresAt(Clock::now() + d); }
  // No deadline (a handler runs: it may stream for as long as it likes).
  void Never();
  Clock::time_point expiry() const;
  // The deadline passed and `on_expiry` ran. Reset by the next ExpiresAt or Never.
  bool expired() const;

 private:
  struct State;
  static void Arm(const std::shared_ptr<State>& st, Clock::time_point at);
  std::shared_ptr<State> st_;
};

}  // namespace sbx::http
