// Fuzz target for sbxd's attach read path (AgentStream::NextViews, issue 15): the agent's
// bytes, split into reads as the first input byte says, must come out as exactly the frames
// FrameDecoder finds in them, in order, or end in an error where FrameDecoder's does; never a
// crash, a view outside the input or a loop. The agent sits on the guest's side: its bytes are
// untrusted. Runs under libFuzzer (clang -fsanitize=fuzzer) or fuzz_main.cc with g++.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio.hpp>

#include "protocol/protocol.h"
#include "service/agent_stream.h"

namespace {

namespace asio = boost::asio;
using sbx::service::AgentByteStream;
using sbx::service::AgentStream;

class ScriptedBytes final : public AgentByteStream {
 public:
  explicit ScriptedBytes(std::deque<std::string> reads) : reads_(std::move(reads)) {}
  asio::awaitable<std::pair<boost::system::error_code, size_t>> ReadSome(
      asio::mutable_buffer buf) override {
    if (reads_.empty()) {
      co_return std::pair{boost::system::error_code(asio::error::eof), size_t{0}};
    }
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

// Reads `stream` to its end; every batch must be the next frames of `want`.
asio::awaitable<void> ReadAll(AgentStream& stream, size_t budget,
                              const std::vector<sbx::protocol::Frame>& want, size_t& got,
                              bool& got_error) {
  std::vector<AgentStream::FrameView> views;
  for (;;) {
    absl::Status st = co_await stream.NextViews(std::chrono::seconds(5), budget, views);
    if (!st.ok()) {
      got_error = st.code() != absl::StatusCode::kUnavailable;  // else: the end of the input
      co_return;
    }
    if (views.empty()) std::abort();  // never idle here: every read returns bytes or EOF
    for (const auto& v : views) {
      if (got >= want.size() || v.type != want[got].type || v.payload != want[got].payload) {
        std::abort();
      }
      ++got;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t step = size > 0 ? (data[0] % 29) * 7 + 1 : 1;
  const size_t budget = size > 1 ? (data[1] % 8) * 4096 + 1 : 1;

  // What FrameDecoder (the reference) finds, and whether it ends in an error.
  std::vector<sbx::protocol::Frame> want;
  bool want_error = false;
  {
    sbx::protocol::FrameDecoder d;
    d.Feed(in);
    for (;;) {
      auto next = d.Next();
      if (!next.ok()) {
        want_error = true;
        break;
      }
      if (!*next) break;
      want.push_back(std::move(**next));
    }
  }

  std::deque<std::string> reads;
  for (size_t pos = 0; pos < size; pos += step) reads.emplace_back(in.substr(pos, step));
  asio::io_context io;
  AgentStream stream(io.get_executor(), std::make_unique<ScriptedBytes>(std::move(reads)));
  size_t got = 0;
  bool got_error = false;  // anything but the end of the input
  asio::co_spawn(io, ReadAll(stream, budget, want, got, got_error), asio::detached);
  io.run();
  if (got != want.size()) std::abort();
  if (got_error != want_error) std::abort();
  return 0;
}
