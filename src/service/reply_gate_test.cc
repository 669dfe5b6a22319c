#include "service/reply_gate.h"

#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx::service {
namespace {

namespace asio = boost::asio;
using Result = absl::StatusOr<ReplyGate::Slot>;

// Runs every handler that is ready (and those they make ready) without waiting on timers:
// progress, not elapsed time, is what the tests look at.
void Drain(asio::io_context& io) {
  io.restart();
  while (io.poll() > 0) {
  }
}

// Starts Acquire as a coroutine; `out` is set when it finishes.
void Start(asio::io_context& io, ReplyGate& gate, std::string id, std::optional<Result>& out) {
  asio::co_spawn(
      io,
      [&gate, &out, id]() -> asio::awaitable<void> {
        out.emplace(co_await gate.Acquire(co_await asio::this_coro::executor, id));
      },
      asio::detached);
}

TEST(ReplyGate, PerSandboxSlotsQueueAndPassOnInOrder) {
  asio::io_context io;
  ReplyGate gate({.in_flight = 8, .per_sandbox = 2, .queue_per_sandbox = 4,
                  .max_wait = std::chrono::hours(1)});
  std::optional<Result> a, b, c, d;
  Start(io, gate, "s1", a);
  Start(io, gate, "s1", b);
  Start(io, gate, "s1", c);
  Start(io, gate, "s1", d);
  Drain(io);
  ASSERT_TRUE(a && a->ok());
  ASSERT_TRUE(b && b->ok());
  EXPECT_FALSE(c.has_value());  // waiting, not refused
  EXPECT_FALSE(d.has_value());
  EXPECT_EQ(gate.in_flight(), 2u);

  a.reset();  // frees a's slot: c (first in line) gets it
  Drain(io);
  ASSERT_TRUE(c && c->ok());
  EXPECT_FALSE(d.has_value());
  EXPECT_EQ(gate.in_flight(), 2u);  // handed over, never released in between

  b.reset();
  c.reset();
  Drain(io);
  ASSERT_TRUE(d && d->ok());
  d.reset();
  EXPECT_EQ(gate.in_flight(), 0u);
}

TEST(ReplyGate, AFullQueueIsRefusedAtOnceWith429) {
  asio::io_context io;
  ReplyGate gate({.in_flight = 8, .per_sandbox = 1, .queue_per_sandbox = 1,
                  .max_wait = std::chrono::hours(1)});
  std::optional<Result> a, b, c;
  Start(io, gate, "s1", a);
  Start(io, gate, "s1", b);
  Start(io, gate, "s1", c);
  Drain(io);
  ASSERT_TRUE(a && a->ok());
  EXPECT_FALSE(b.has_value());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ApiErrorCode(c->status()), "too_many_requests");
  // Another sandbox is not held up by s1's queue.
  std::optional<Result> other;
  Start(io, gate, "s2", other);
  Drain(io);
  ASSERT_TRUE(other && other->ok());
  a.reset();
  Drain(io);
  ASSERT_TRUE(b && b->ok());
}

TEST(ReplyGate, AllSlotsTakenIsShedWith503) {
  asio::io_context io;
  ReplyGate gate({.in_flight = 2, .per_sandbox = 2, .queue_per_sandbox = 4,
                  .max_wait = std::chrono::hours(1)});
  std::optional<Result> a, b, c;
  Start(io, gate, "s1", a);
  Start(io, gate, "s2", b);
  Start(io, gate, "s3", c);
  Drain(io);
  ASSERT_TRUE(a && a->ok());
  ASSERT_TRUE(b && b->ok());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ApiErrorCode(c->status()), "server_busy");
  a.reset();
  std::optional<Result> again;
  Start(io, gate, "s3", again);
  Drain(io);
  ASSERT_TRUE(again && again->ok());
}

TEST(ReplyGate, AWaiterGivesUpAfterMaxWaitAndLeavesTheQueue) {
  asio::io_context io;
  ReplyGate gate({.in_flight = 8, .per_sandbox = 1, .queue_per_sandbox = 1,
                  .max_wait = std::chrono::milliseconds(1)});
  std::optional<Result> a, b;
  Start(io, gate, "s1", a);
  Start(io, gate, "s1", b);
  // Runs until b's 1 ms wait ends: completion, not elapsed time, is what is asserted.
  while (!b.has_value()) io.run_one();
  ASSERT_TRUE(a && a->ok());
  EXPECT_EQ(ApiErrorCode(b->status()), "too_many_requests");
  // b left the queue: a new request may queue again, and a's release frees the slot for it.
  std::optional<Result> c;
  Start(io, gate, "s1", c);
  Drain(io);
  EXPECT_FALSE(c.has_value());
  a.reset();
  while (!c.has_value()) io.run_one();
  EXPECT_TRUE(c->ok());
  c.reset();
  EXPECT_EQ(gate.in_flight(), 0u);
}

}  // namespace
}  // namespace sbx::service
