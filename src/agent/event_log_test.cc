#include "agent/event_log.h"

#include <memory>
#include <span>
#include <string>
#include <utility>

#include <gtest/gtest.h>

namespace sbx::agent {
namespace {

using protocol::Stream;

std::string Bytes(size_t n, char c = 'x') { return std::string(n, c); }

TEST(EventLog, IdsAreContiguousAcrossStreamsAndExitIsLast) {
  EventLog log(1 << 20);
  EXPECT_EQ(log.oldest_id(), 1u);
  EXPECT_EQ(log.next_id(), 1u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "a"), 1u);
  EXPECT_EQ(log.AppendOutput(Stream::kStderr, "bb"), 2u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "ccc"), 3u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, ""), 0u);  // empty chunks are not events
  protocol::ExitEvent ev;
  ev.exit_code = 0;
  EXPECT_EQ(log.AppendExit(ev), 4u);
  EXPECT_TRUE(log.has_exit());
  EXPECT_EQ(log.exit_id(), 4u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "late"), 0u);  // nothing after the exit
  EXPECT_EQ(log.AppendExit(ev), 4u);

  const LogEvent* e = log.Get(4);
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->is_exit);
  EXPECT_EQ(e->exit.event_id, 4u);
  EXPECT_EQ(log.Get(0), nullptr);
  EXPECT_EQ(log.Get(5), nullptr);
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(log.Get(id)->id, id);
}

TEST(EventLog, OffsetsCountBytesPerStream) {
  EventLog log(1 << 20);
  log.AppendOutput(Stream::kStdout, "hello");  // 1: stdout 0
  log.AppendOutput(Stream::kStderr, "oops");   // 2: stderr 0
  log.AppendOutput(Stream::kStdout, "world");  // 3: stdout 5
  log.AppendOutput(Stream::kStderr, "!");      // 4: stderr 4
  EXPECT_EQ(log.Get(1)->offset, 0u);
  EXPECT_EQ(log.Get(2)->offset, 0u);
  EXPECT_EQ(log.Get(3)->offset, 5u);
  EXPECT_EQ(log.Get(4)->offset, 4u);
  EXPECT_EQ(log.Get(3)->stream, Stream::kStdout);
  EXPECT_EQ(log.Get(4)->stream, Stream::kStderr);
  EXPECT_EQ(log.total_bytes(Stream::kStdout), 10u);
  EXPECT_EQ(log.total_bytes(Stream::kStderr), 5u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 10u);
}

TEST(EventLog, NeverEvictsUndeliveredEventsAndSignalsBackPressure) {
  EventLog log(100);
  for (int i = 0; i < 5; ++i) log.AppendOutput(Stream::kStdout, Bytes(30));
  // 150 bytes retained, over the budget, but nothing has been delivered: all of it stays.
  EXPECT_EQ(log.oldest_id(), 1u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 150u);
  EXPECT_FALSE(log.CanRead(Stream::kStdout));
  // The other stream is unaffected.
  EXPECT_TRUE(log.CanRead(Stream::kStderr));
}

TEST(EventLog, EvictsOnlyDeliveredEventsFromTheFront) {
  EventLog log(100);
  for (int i = 0; i < 5; ++i) log.AppendOutput(Stream::kStdout, Bytes(30));  // ids 1..5
  EXPECT_TRUE(log.MarkDelivered(2));
  // Evicting 1 and 2 leaves 90 bytes < 100: the stream may be read again.
  EXPECT_EQ(log.oldest_id(), 3u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 90u);
  EXPECT_EQ(log.evicted_bytes(Stream::kStdout), 60u);
  EXPECT_TRUE(log.CanRead(Stream::kStdout));
  EXPECT_EQ(log.Get(2), nullptr);
  EXPECT_EQ(log.Get(3)->offset, 60u);

  // Delivering everything evicts only down to below the budget: retention for re-attaches.
  EXPECT_FALSE(log.MarkDelivered(5));
  EXPECT_EQ(log.oldest_id(), 3u);
  log.AppendOutput(Stream::kStdout, Bytes(30));  // 120 bytes: 3 (delivered) is evictable now
  EXPECT_EQ(log.oldest_id(), 4u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 90u);
  EXPECT_EQ(log.delivered(), 5u);
  EXPECT_FALSE(log.MarkDelivered(3));  // delivered() never moves back
  EXPECT_EQ(log.delivered(), 5u);
}

TEST(EventLog, StreamAtExactlyTheBudgetCanBeTrimmed) {
  EventLog log(60);
  log.AppendOutput(Stream::kStdout, Bytes(30));
  log.AppendOutput(Stream::kStdout, Bytes(30));
  EXPECT_FALSE(log.CanRead(Stream::kStdout));
  log.MarkDelivered(1);
  EXPECT_TRUE(log.CanRead(Stream::kStdout));
  EXPECT_EQ(log.oldest_id(), 2u);
}

TEST(EventLog, EvictionKeepsIdsContiguousAcrossStreams) {
  EventLog log(50);
  log.AppendOutput(Stream::kStdout, Bytes(10));  // 1
  log.AppendOutput(Stream::kStderr, Bytes(40));  // 2
  log.AppendOutput(Stream::kStdout, Bytes(10));  // 3
  log.AppendOutput(Stream::kStderr, Bytes(40));  // 4: stderr at 80 > 50
  EXPECT_FALSE(log.CanRead(Stream::kStderr));
  log.MarkDelivered(2);
  // Only the front may go: 1 (stdout) then 2 (stderr) → stderr 40 < 50.
  EXPECT_EQ(log.oldest_id(), 3u);
  EXPECT_EQ(log.retained_bytes(Stream::kStderr), 40u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 10u);
  EXPECT_EQ(log.evicted_bytes(Stream::kStdout), 10u);
  EXPECT_EQ(log.evicted_bytes(Stream::kStderr), 40u);
  for (uint64_t id = log.oldest_id(); id < log.next_id(); ++id) {
    ASSERT_NE(log.Get(id), nullptr) << id;
  }
}

TEST(EventLog, OversizedChunkStaysUntilDelivered) {
  EventLog log(50);
  log.AppendOutput(Stream::kStdout, Bytes(60));  // 1, over budget on its own
  // Nothing delivered: the front stays, whatever happens behind it.
  log.AppendOutput(Stream::kStderr, Bytes(10));
  EXPECT_EQ(log.oldest_id(), 1u);
  log.MarkDelivered(1);
  EXPECT_EQ(log.oldest_id(), 2u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 0u);
  EXPECT_TRUE(log.CanRead(Stream::kStdout));
}

TEST(EventLog, ResyncWhenAfterIdIsTooOld) {
  EventLog log(100);
  for (int i = 0; i < 4; ++i) log.AppendOutput(Stream::kStdout, Bytes(40));   // 1..4
  log.AppendOutput(Stream::kStderr, Bytes(7));                               // 5
  log.MarkDelivered(5);
  ASSERT_EQ(log.oldest_id(), 3u);  // 160 - 80 = 80 < 100
  // A client that has seen 2 needs 3, which is retained: no resync.
  EXPECT_FALSE(log.ResyncFor(2).has_value());
  EXPECT_FALSE(log.ResyncFor(4).has_value());
  EXPECT_FALSE(log.ResyncFor(100).has_value());
  EXPECT_FALSE(log.ResyncFor(UINT64_MAX).has_value());
  for (uint64_t after : {0u, 1u}) {
    auto r = log.ResyncFor(after);
    ASSERT_TRUE(r.has_value()) << after;
    EXPECT_EQ(r->oldest_available_id, 3u);
    EXPECT_EQ(r->stdout_offset, 80u);
    EXPECT_EQ(r->stderr_offset, 0u);  // no stderr byte was evicted
  }
  EXPECT_EQ(log.Get(3)->offset, 80u);  // the first retained stdout byte matches the resync
}

TEST(EventLog, ExitEventIsNeverEvicted) {
  EventLog log(10);
  log.AppendOutput(Stream::kStdout, Bytes(50));
  log.AppendExit({});
  log.MarkDelivered(2);
  EXPECT_EQ(log.oldest_id(), 2u);
  ASSERT_NE(log.Get(2), nullptr);
  EXPECT_TRUE(log.Get(2)->is_exit);
  auto r = log.ResyncFor(0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->oldest_available_id, 2u);
  EXPECT_EQ(r->stdout_offset, 50u);
}

TEST(EventLog, DropDeliveredKeepsUndeliveredAndExit) {
  EventLog log(1 << 20);
  log.AppendOutput(Stream::kStdout, Bytes(10));  // 1
  log.AppendOutput(Stream::kStderr, Bytes(20));  // 2
  log.AppendOutput(Stream::kStdout, Bytes(30));  // 3
  log.MarkDelivered(2);
  EXPECT_EQ(log.DropDelivered(), 30u);
  EXPECT_EQ(log.oldest_id(), 3u);
  log.AppendExit({});
  log.MarkDelivered(4);
  EXPECT_EQ(log.DropDelivered(), 30u);
  EXPECT_EQ(log.oldest_id(), 4u);
  ASSERT_NE(log.Get(4), nullptr);
  auto r = log.ResyncFor(0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->oldest_available_id, 4u);
  EXPECT_EQ(r->stdout_offset, 40u);
  EXPECT_EQ(r->stderr_offset, 20u);
}

TEST(EventLog, ReaderThatKeepsUpGetsEveryByte) {
  // Simulates the agent loop: the writer may only append while CanRead(); the reader takes
  // one event at a time and reports it delivered.
  EventLog log(1000);
  std::string written, read;
  uint64_t cursor = 1;
  uint64_t counter = 0;
  int stalls = 0;
  while (written.size() < 200000) {
    if (log.CanRead(Stream::kStdout)) {
      std::string chunk;
      for (size_t i = 0; i < 1 + counter % 300; ++i) chunk.push_back(static_cast<char>(counter * 7 + i));
      ++counter;
      written += chunk;
      log.AppendOutput(Stream::kStdout, chunk);
    } else {
      ++stalls;
    }
    // The reader is slower than the writer: it only reads every third step.
    if (counter % 3 == 0 || !log.CanRead(Stream::kStdout)) {
      const LogEvent* e = log.Get(cursor);
      if (e) {
        ASSERT_EQ(e->offset, read.size());
        read += e->data();
        log.MarkDelivered(cursor++);
      }
    }
    ASSERT_LE(log.retained_bytes(Stream::kStdout), 1000u + 300u);
  }
  while (const LogEvent* e = log.Get(cursor)) {
    read += e->data();
    log.MarkDelivered(cursor++);
  }
  EXPECT_EQ(read, written);
  EXPECT_GT(stalls, 0);
}

}  // namespace
}  // namespace sbx::agent

namespace sbx::agent {
namespace {

TEST(EventLogMerge, GrowsTheUnsealedNewestEventOfTheSameStream) {
  EventLog log(1 << 20, /*merge_up_to=*/10);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "abc"), 1u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "def"), 1u);  // merged
  EXPECT_EQ(log.AppendOutput(Stream::kStderr, "E"), 2u);    // other stream: a new event
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "ghi"), 3u);  // not the newest any more
  EXPECT_EQ(log.Get(1)->data(), "abcdef");
  EXPECT_EQ(log.Get(1)->offset, 0u);
  EXPECT_EQ(log.Get(3)->offset, 6u);
  EXPECT_EQ(log.Get(2)->offset, 0u);
  EXPECT_EQ(log.AppendOutput(Stream::kStderr, "F"), 4u);
  EXPECT_EQ(log.AppendOutput(Stream::kStderr, "G"), 4u);
  EXPECT_EQ(log.Get(4)->offset, 1u);
  EXPECT_EQ(log.Get(4)->data(), "FG");
  EXPECT_EQ(log.total_bytes(Stream::kStdout), 9u);
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 9u);
  EXPECT_EQ(log.total_bytes(Stream::kStderr), 3u);
  EXPECT_EQ(log.next_id(), 5u);
}

TEST(EventLogMerge, RespectsTheCap) {
  EventLog log(1 << 20, /*merge_up_to=*/8);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "12345"), 1u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "678"), 1u);  // exactly 8
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "9"), 2u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, std::string(20, 'x')), 3u);  // larger than the cap
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "y"), 4u);
  EXPECT_EQ(log.Get(1)->data(), "12345678");
  EXPECT_EQ(log.Get(3)->data().size(), 20u);
  EXPECT_EQ(log.Get(4)->offset, 29u);
}

TEST(EventLogMerge, NeverChangesASealedOrDeliveredEvent) {
  EventLog log(1 << 20, /*merge_up_to=*/1 << 10);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "seen"), 1u);
  log.Seal(1);  // a connection took it
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "more"), 2u);
  EXPECT_EQ(log.Get(1)->data(), "seen");
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "+"), 2u);
  EXPECT_TRUE(!log.MarkDelivered(2));  // delivered implies sealed
  EXPECT_EQ(log.sealed(), 2u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "next"), 3u);
  EXPECT_EQ(log.Get(2)->data(), "more+");
  EXPECT_EQ(log.Get(3)->offset, 9u);
}

TEST(EventLogMerge, MergedBytesCountAgainstTheBudget) {
  EventLog log(100, /*merge_up_to=*/1 << 10);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(log.AppendOutput(Stream::kStdout, Bytes(30)), 1u);
  EXPECT_FALSE(log.CanRead(Stream::kStdout));  // back-pressure as without merging
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 150u);
  log.Seal(1);
  log.MarkDelivered(1);
  // The single 150-byte event was delivered: evicted whole, the stream may be read again.
  EXPECT_EQ(log.retained_bytes(Stream::kStdout), 0u);
  EXPECT_TRUE(log.CanRead(Stream::kStdout));
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "z"), 2u);
  EXPECT_EQ(log.Get(2)->offset, 150u);
}

TEST(EventLogMerge, NothingMergesIntoOrAfterTheExit) {
  EventLog log(1 << 20, /*merge_up_to=*/1 << 10);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "a"), 1u);
  protocol::ExitEvent ev;
  ev.exit_code = 0;
  EXPECT_EQ(log.AppendExit(ev), 2u);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "b"), 0u);
  EXPECT_EQ(log.Get(1)->data(), "a");
}

}  // namespace
}  // namespace sbx::agent

namespace sbx::agent {
namespace {

// A read straight into the log (ReserveOutput + CommitOutput) must leave exactly what
// AppendOutput of the same bytes leaves: ids, offsets, merging, budget.
TEST(EventLogReserve, CommitIsAppendOutputWithoutTheCopy) {
  EventLog direct(1 << 20, /*merge_up_to=*/10);
  EventLog copied(1 << 20, /*merge_up_to=*/10);
  const std::pair<Stream, std::string> chunks[] = {
      {Stream::kStdout, "abc"}, {Stream::kStdout, "def"},   {Stream::kStderr, "E"},
      {Stream::kStdout, "ghi"}, {Stream::kStdout, "jklmnop"}, {Stream::kStdout, "q"}};
  for (const auto& [stream, text] : chunks) {
    // The agent reserves what the pipe holds (FIONREAD) and reads that.
    std::span<char> room = direct.ReserveOutput(stream, text.size());
    ASSERT_EQ(room.size(), text.size());
    text.copy(room.data(), text.size());
    EXPECT_EQ(direct.CommitOutput(stream, text.size()), copied.AppendOutput(stream, text));
  }
  ASSERT_EQ(direct.next_id(), copied.next_id());
  for (uint64_t id = 1; id < direct.next_id(); ++id) {
    EXPECT_EQ(direct.Get(id)->data(), copied.Get(id)->data()) << id;
    EXPECT_EQ(direct.Get(id)->offset, copied.Get(id)->offset) << id;
    EXPECT_EQ(direct.Get(id)->stream, copied.Get(id)->stream) << id;
  }
  EXPECT_EQ(direct.total_bytes(Stream::kStdout), copied.total_bytes(Stream::kStdout));
  EXPECT_EQ(direct.retained_bytes(Stream::kStderr), copied.retained_bytes(Stream::kStderr));
}

TEST(EventLogReserve, NothingReadOrTooMuchClaimedAddsNothing) {
  EventLog log(1 << 20, /*merge_up_to=*/1 << 10);
  ASSERT_FALSE(log.ReserveOutput(Stream::kStdout, 8).empty());
  EXPECT_EQ(log.CommitOutput(Stream::kStdout, 0), 0u);  // EOF: the read returned 0
  EXPECT_EQ(log.next_id(), 1u);
  ASSERT_FALSE(log.ReserveOutput(Stream::kStdout, 8).empty());
  EXPECT_EQ(log.CommitOutput(Stream::kStdout, 9), 0u);  // more than the room
  EXPECT_EQ(log.CommitOutput(Stream::kStderr, 1), 0u);  // nothing reserved any more
  EXPECT_EQ(log.next_id(), 1u);
  ASSERT_FALSE(log.ReserveOutput(Stream::kStdout, 8).empty());
  EXPECT_EQ(log.CommitOutput(Stream::kStderr, 4), 0u);  // reserved for the other stream
  EXPECT_EQ(log.total_bytes(Stream::kStdout) + log.total_bytes(Stream::kStderr), 0u);
  EXPECT_TRUE(log.ReserveOutput(Stream::kStdout, 0).empty());
}

TEST(EventLogReserve, NoRoomAfterTheExit) {
  EventLog log(1 << 20, /*merge_up_to=*/1 << 10);
  std::span<char> room = log.ReserveOutput(Stream::kStdout, 4);
  ASSERT_EQ(room.size(), 4u);
  protocol::ExitEvent ev;
  log.AppendExit(ev);
  EXPECT_EQ(log.CommitOutput(Stream::kStdout, 4), 0u);
  EXPECT_TRUE(log.ReserveOutput(Stream::kStdout, 4).empty());
  EXPECT_EQ(log.next_id(), 2u);
}

// A connection keeps the bytes of the events it is sending (Agent::Refill): eviction by a
// faster connection's delivery, or growth of the tail, must not change them under it.
TEST(EventLogReserve, SharedBytesOutliveEvictionAndAreNeverGrown) {
  EventLog log(/*budget=*/8, /*merge_up_to=*/1 << 10);
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "12345678"), 1u);
  log.Seal(1);
  std::shared_ptr<const OutputBytes> held = log.Get(1)->bytes;
  EXPECT_EQ(log.AppendOutput(Stream::kStdout, "9"), 2u);  // sealed: not merged into 1
  log.MarkDelivered(1);                                    // over budget: 1 is evicted
  EXPECT_EQ(log.Get(1), nullptr);
  EXPECT_EQ(held->view(), "12345678");
}

}  // namespace
}  // namespace sbx::agent
