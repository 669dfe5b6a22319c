// A connection's read deadline that costs nothing to move (issue 15: the per-request path).
//
// Every request on a keep-alive connection moves the deadline (idle, then header, then none
// while the handler runs). Racing each read against a timer (`read || timer.async_wait`)
// spawned two coroutines and a parallel group per read, and re-armed the timer each time.
// Here one timer per connection is armed at most at the earliest due time it was asked for,
// and re-checked when it fires: moving the deadline later is a store, and the timer fires
// about once per idle period of a busy connection. On expiry it cancels the socket's pending
// operations: the read ends with operation_aborted, the reader asks `expired()` and answers
// 408 (the socket stays open; beast's own stream timer closes it, and then nothing can be
// answered).
//
// Not thread-safe: the owner and the timer's handler run on one strand (the connection's).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

namespace sbx::http {

class ReadDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  // `socket` must outlive this object; its operations are what an expiry cancels.
  ReadDeadline(const boost::asio::any_io_executor& ex, boost::asio::ip::tcp::socket& socket);
  ~ReadDeadline();
  ReadDeadline(const ReadDeadline&) = delete;
  ReadDeadline& operator=(const ReadDeadline&) = delete;

  void ExpiresAt(Clock::time_point due);
  void ExpiresAfter(Clock::duration d) { ExpiresAt(Clock::now() + d); }
  // No deadline (a handler runs: it may stream for as long as it likes).
  void Never();
  Clock::time_point expiry() const;
  // The deadline passed while an operation was pending, and cancelled it. Reset by the next
  // ExpiresAt or Never.
  bool expired() const;

 private:
  struct State;
  static void Arm(const std::shared_ptr<State>& st, Clock::time_point at);
  // Shared with the timer's pending handler, which may run after this object is gone (a wait
  // that completed just before the cancel of the destructor): it then sees `gone`.
  std::shared_ptr<State> st_;
};

}  // namespace sbx::http
