// AgentStream::NextViews (attach's bulk read): frames split anywhere across reads come out
// whole and in order, a batch stops near its budget, and a bad frame after good ones is
// reported only after they are handed out; a stream's read buffer is reused by the next
// stream of the same thread. AttachStream::ExitWithin finds an exit among the first frames and
// leaves every frame (or the error) for NextBatch.
#include "service/agent_stream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "protocol/protocol.h"
#include "service/agent_client.h"

namespace sbx::service {
namespace {

using protocol::FrameType;

// Replays scripted reads; EOF after the last.
class ScriptedBytes final : public AgentByteStream {
 public:
  explicit ScriptedBytes(std::deque<std::string> reads) : reads_(std::move(reads)) {}
  asio::awaitable<std::pair<boost::system::error_code, size_t>> ReadSome(
      asio::mutable_buffer buf) override {
    if (reads_.empty()) co_return std::pair{boost::system::error_code(asio::error::eof), size_t{0}};
    std::string& r = reads_.front();
    const size_t n = std::min(r.size(), buf.size());
    std::memcpy(buf.data(), r.data(), n);
    r.erase(0, n);
    if (r.empty()) reads_.pop_front();
    co_return std::pair{boost::system::error_code(), n};
  }
  asio::awaitable<boost::system::error_code> WriteAll(asio::const_buffer) override {
    co_return boost::system::error_code();
  }
  void Cancel() override {}
  void Close() override {}

 private:
  std::deque<std::string> reads_;
};

struct Got {
  std::vector<std::pair<FrameType, std::string>> frames;
  std::vector<size_t> batch_sizes;
  absl::Status end;
};

Got ReadAll(std::deque<std::string> reads, size_t max_payload) {
  asio::io_context io;
  Got got;
  auto stream = std::make_unique<AgentStream>(io.get_executor(),
                                              std::make_unique<ScriptedBytes>(std::move(reads)));
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        std::vector<AgentStream::FrameView> views;
        for (;;) {
          absl::Status st = co_await stream->NextViews(std::chrono::seconds(5), max_payload, views);
          if (!st.ok()) {
            got.end = st;
            co_return;
          }
          got.batch_sizes.push_back(views.size());
          for (const auto& v : views) got.frames.emplace_back(v.type, std::string(v.payload));
        }
      },
      asio::detached);
  io.run();
  return got;
}

std::string OutputFrame(uint64_t id, const std::string& data) {
  std::string out;
  protocol::AppendOutputFrame(out, id, protocol::Stream::kStdout, 0, data);
  return out;
}

TEST(AgentStreamNextViews, FramesSplitAnywhereComeOutWholeAndInOrder) {
  std::mt19937 rng(5);
  std::string wire;
  std::vector<std::string> payloads;
  for (size_t n : {0, 1, 100, 70000, 3, 300000, 17}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    std::string frame = OutputFrame(payloads.size() + 1, data);
    payloads.push_back(frame.substr(protocol::kHeaderSize));
    wire += frame;
  }
  wire += protocol::EncodeFrame(FrameType::kExit, "{\"event_id\":8}");
  payloads.push_back("{\"event_id\":8}");
  // Reads of 1 byte, of 7 bytes, of random sizes, and all at once.
  for (int mode = 0; mode < 4; ++mode) {
    std::deque<std::string> reads;
    for (size_t at = 0; at < wire.size();) {
      size_t n = mode == 0 ? 1 : mode == 1 ? 7 : mode == 2 ? 1 + rng() % 90000 : wire.size();
      if (mode == 0 && at > 200) n = 4096;  // keeps the test fast once headers are covered
      n = std::min(n, wire.size() - at);
      reads.push_back(wire.substr(at, n));
      at += n;
    }
    Got got = ReadAll(std::move(reads), 1 << 20);
    EXPECT_EQ(got.end.code(), absl::StatusCode::kUnavailable) << got.end;
    ASSERT_EQ(got.frames.size(), payloads.size()) << mode;
    for (size_t i = 0; i < payloads.size(); ++i) {
      EXPECT_EQ(got.frames[i].second, payloads[i]) << "mode " << mode << " frame " << i;
      EXPECT_EQ(got.frames[i].first, i + 1 == payloads.size() ? FrameType::kExit
                                                               : FrameType::kOutput);
    }
  }
}

TEST(AgentStreamNextViews, ABatchStopsAtItsBudgetButNeverEmpty) {
  std::string wire;
  for (int i = 0; i < 6; ++i) wire += OutputFrame(i + 1, std::string(1000, 'x'));
  Got got = ReadAll({wire}, 2500);  // three frames of 1017 bytes pass 2500
  ASSERT_EQ(got.frames.size(), 6u);
  EXPECT_EQ(got.batch_sizes, (std::vector<size_t>{3, 3}));
  got = ReadAll({wire}, 1);  // a budget below one frame still hands out one
  EXPECT_EQ(got.batch_sizes, (std::vector<size_t>{1, 1, 1, 1, 1, 1}));
}

TEST(AgentStreamNextViews, GoodFramesBeforeABadOneAreHandedOutFirst) {
  std::string wire = OutputFrame(1, "ok");
  wire += std::string("\xff\xff\xff\xff\x09\x09\x00\x00", 8);  // bad version and type
  Got got = ReadAll({wire}, 1 << 20);
  ASSERT_EQ(got.frames.size(), 1u);
  EXPECT_FALSE(got.end.ok());
  EXPECT_NE(got.end.code(), absl::StatusCode::kUnavailable) << got.end;
}

TEST(AgentStreamReadBuffer, TheNextStreamOfAThreadReusesTheLastOnesBuffer) {
  // Drain any spare an earlier test left, then hand back a known buffer.
  (void)AgentStream::TakeReadBuffer();
  std::unique_ptr<char[]> mine = AgentStream::TakeReadBuffer();
  char* const p = mine.get();
  AgentStream::GiveBackReadBuffer(std::move(mine));
  {
    asio::io_context io;
    AgentStream s(io.get_executor(), std::make_unique<ScriptedBytes>(std::deque<std::string>{}));
  }  // took `p` as its buffer, and gave it back here
  std::unique_ptr<char[]> again = AgentStream::TakeReadBuffer();
  EXPECT_EQ(again.get(), p);
  // The spare is now taken: the next one is new, and another thread never sees this one.
  std::unique_ptr<char[]> fresh = AgentStream::TakeReadBuffer();
  EXPECT_NE(fresh.get(), p);
  AgentStream::GiveBackReadBuffer(std::move(again));
  char* other = nullptr;
  std::thread([&] { other = AgentStream::TakeReadBuffer().get(); }).join();
  EXPECT_NE(other, p);
}

struct Primed {
  std::optional<SessionExit> exit;
  std::vector<std::vector<FrameType>> batches;
  absl::Status end;
};

// ExitWithin, then NextBatch until the stream ends.
Primed PrimeThenRead(std::deque<std::string> reads) {
  asio::io_context io;
  Primed got;
  protocol::AttachReply reply;
  reply.started = true;
  AttachStream stream(std::make_unique<AgentStream>(
                          io.get_executor(), std::make_unique<ScriptedBytes>(std::move(reads))),
                      reply);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const auto wait = std::chrono::milliseconds(50);
        got.exit = co_await stream.ExitWithin(wait, 1 << 20);
        std::vector<AttachFrame> frames;
        for (;;) {
          const auto idle = std::chrono::seconds(5);
          absl::Status st = co_await stream.NextBatch(idle, 1 << 20, frames);
          if (!st.ok()) {
            got.end = st;
            co_return;
          }
          std::vector<FrameType> types;
          for (const AttachFrame& f : frames) {
            auto ev = f.Decode();
            types.push_back(!ev.ok() ? FrameType::kHello
                            : ev->kind == AttachEvent::Kind::kExit ? FrameType::kExit
                                                                   : FrameType::kOutput);
          }
          got.batches.push_back(std::move(types));
        }
      },
      asio::detached);
  io.run();
  return got;
}

std::string ExitFrame(uint64_t id, int code) {
  protocol::ExitEvent ev;
  ev.event_id = id;
  ev.exit_code = code;
  return protocol::EncodeFrame(FrameType::kExit, protocol::EncodeExit(ev));
}

TEST(AttachStreamExitWithin, AnExitAmongTheFirstFramesIsFoundAndStillRelayed) {
  Primed got = PrimeThenRead({OutputFrame(1, "hi") + ExitFrame(2, 3)});
  ASSERT_TRUE(got.exit.has_value());
  EXPECT_EQ(got.exit->event_id, 2u);
  EXPECT_EQ(got.exit->exit_code, 3);
  ASSERT_EQ(got.batches.size(), 1u);
  EXPECT_EQ(got.batches[0], (std::vector<FrameType>{FrameType::kOutput, FrameType::kExit}));
  EXPECT_EQ(got.end.code(), absl::StatusCode::kUnavailable) << got.end;
}

TEST(AttachStreamExitWithin, WithoutAnExitTheFramesWaitForNextBatch) {
  Primed got = PrimeThenRead({OutputFrame(1, "a"), OutputFrame(2, "b") + ExitFrame(3, 0)});
  EXPECT_FALSE(got.exit.has_value());
  ASSERT_EQ(got.batches.size(), 2u);
  EXPECT_EQ(got.batches[0], (std::vector<FrameType>{FrameType::kOutput}));
  EXPECT_EQ(got.batches[1], (std::vector<FrameType>{FrameType::kOutput, FrameType::kExit}));
}

TEST(AttachStreamExitWithin, AnErrorIsReportedByTheFirstNextBatch) {
  Primed got = PrimeThenRead({});
  EXPECT_FALSE(got.exit.has_value());
  EXPECT_TRUE(got.batches.empty());
  EXPECT_EQ(got.end.code(), absl::StatusCode::kUnavailable) << got.end;
}

TEST(AttachStreamExitWithin, AnExitBehindAFrameThatDoesNotDecodeIsNotReported) {
  // The relay stops at the bad frame, so the exit would never reach the client: the caller
  // must record "running" as before, not the exit.
  Primed got = PrimeThenRead({protocol::EncodeFrame(FrameType::kOutput, "x") + ExitFrame(2, 0)});
  EXPECT_FALSE(got.exit.has_value());
  ASSERT_EQ(got.batches.size(), 1u);
  EXPECT_EQ(got.batches[0], (std::vector<FrameType>{FrameType::kHello, FrameType::kExit}));
}

}  // namespace
}  // namespace sbx::service
