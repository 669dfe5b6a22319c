#include "protocol/protocol.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/status_util.h"
#include "protocol/limits.h"

namespace sbx::protocol {
namespace {

std::string Header(uint32_t length, uint8_t version, uint8_t type, uint16_t reserved) {
  std::string h;
  for (int shift = 24; shift >= 0; shift -= 8) h.push_back(static_cast<char>(length >> shift));
  h.push_back(static_cast<char>(version));
  h.push_back(static_cast<char>(type));
  h.push_back(static_cast<char>(reserved >> 8));
  h.push_back(static_cast<char>(reserved));
  return h;
}

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(Frame, EncodesBigEndianHeader) {
  std::string f = EncodeFrame(FrameType::kRequest, "abc");
  ASSERT_EQ(f.size(), kHeaderSize + 3);
  EXPECT_EQ(f.substr(0, 8), Header(3, kVersion, 2, 0));
  EXPECT_EQ(f.substr(8), "abc");

  std::string big(0x010203, 'x');
  std::string g = EncodeFrame(FrameType::kOutput, big);
  EXPECT_EQ(static_cast<uint8_t>(g[0]), 0x00);
  EXPECT_EQ(static_cast<uint8_t>(g[1]), 0x01);
  EXPECT_EQ(static_cast<uint8_t>(g[2]), 0x02);
  EXPECT_EQ(static_cast<uint8_t>(g[3]), 0x03);
}

TEST(Frame, HeaderRoundTripsEveryType) {
  for (uint8_t t = 1; t <= 6; ++t) {
    std::string f = EncodeFrame(static_cast<FrameType>(t), std::string(17, 'p'));
    auto h = DecodeHeader(Bytes(f));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(static_cast<uint8_t>(h->first), t);
    EXPECT_EQ(h->second, 17u);
  }
}

TEST(Frame, RejectsBadVersion) {
  std::string h = Header(0, 2, 1, 0);
  auto r = DecodeHeader(Bytes(h));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(r.status()).find("version 2"), std::string::npos) << r.status();
}

TEST(Frame, RejectsUnknownType) {
  for (uint8_t t : {0, 9, 255}) {
    std::string h = Header(0, kVersion, t, 0);
    auto r = DecodeHeader(Bytes(h));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(Msg(r.status()).find("frame type"), std::string::npos) << r.status();
  }
}

TEST(Frame, RejectsNonZeroReserved) {
  std::string h = Header(0, kVersion, 1, 0x0100);
  auto r = DecodeHeader(Bytes(h));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(r.status()).find("reserved"), std::string::npos) << r.status();
}

TEST(Frame, RejectsOversizePayload) {
  std::string ok = Header(kMaxPayload, kVersion, 4, 0);
  EXPECT_TRUE(DecodeHeader(Bytes(ok)).ok());
  std::string h = Header(kMaxPayload + 1, kVersion, 4, 0);
  auto r = DecodeHeader(Bytes(h));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(r.status()).find("payload length"), std::string::npos) << r.status();
  std::string huge = Header(0xffffffffu, kVersion, 4, 0);
  EXPECT_FALSE(DecodeHeader(Bytes(huge)).ok());
}

TEST(FrameDecoder, DecodesFramesFedOneByteAtATime) {
  std::string stream;
  std::vector<Frame> want;
  for (int i = 0; i < 50; ++i) {
    Frame f{static_cast<FrameType>(1 + i % 6), std::string(static_cast<size_t>(i * 7), 'a' + i % 26)};
    stream += EncodeFrame(f.type, f.payload);
    want.push_back(f);
  }
  FrameDecoder d;
  std::vector<Frame> got;
  for (char c : stream) {
    d.Feed(std::string_view(&c, 1));
    for (;;) {
      auto r = d.Next();
      ASSERT_TRUE(r.ok()) << r.status();
      if (!r->has_value()) break;
      got.push_back(std::move(**r));
    }
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].type, want[i].type);
    EXPECT_EQ(got[i].payload, want[i].payload);
  }
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoder, DecodesManyFramesFromOneFeed) {
  std::string stream;
  for (int i = 0; i < 1000; ++i) stream += EncodeFrame(FrameType::kOutput, std::to_string(i));
  stream += EncodeFrame(FrameType::kExit, "").substr(0, 5);  // partial trailing frame
  FrameDecoder d;
  d.Feed(stream);
  for (int i = 0; i < 1000; ++i) {
    auto r = d.Next();
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ((*r)->payload, std::to_string(i));
  }
  auto r = d.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(d.buffered(), 5u);
  // Compaction keeps the partial frame intact.
  d.Feed(EncodeFrame(FrameType::kExit, "").substr(5));
  r = d.Next();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->type, FrameType::kExit);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoder, ErrorIsSticky) {
  FrameDecoder d;
  d.Feed(Header(1, 9, 1, 0));
  d.Feed("x");
  auto r = d.Next();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Msg(r.status()).find("version 9"), std::string::npos);
  d.Feed(EncodeFrame(FrameType::kHello, "{}"));
  EXPECT_FALSE(d.Next().ok());
}

TEST(FrameDecoder, RejectsOversizeBeforePayloadArrives) {
  FrameDecoder d;
  d.Feed(Header(kMaxPayload + 1, kVersion, 4, 0));
  EXPECT_FALSE(d.Next().ok());
}

// sbxd reading an agent: each frame type has its own bound, checked on the header alone, so a
// hostile agent cannot make sbxd buffer 16 MiB per connection (issue 13, finding 6).
TEST(FrameDecoder, AgentBoundsRefuseEachTypeOverItsLimitOnTheHeader) {
  const std::pair<FrameType, uint32_t> cases[] = {
      {FrameType::kHello, kMaxHelloBytes},       {FrameType::kResponse, kMaxSmallResponseBytes},
      {FrameType::kOutput, kMaxOutputFrameBytes}, {FrameType::kExit, kMaxEventBytes},
      {FrameType::kResync, kMaxEventBytes},      {FrameType::kData, kMaxDataFrameBytes},
      {FrameType::kEnd, kMaxEndBytes},
  };
  for (const auto& [type, limit] : cases) {
    SCOPED_TRACE(static_cast<int>(type));
    FrameDecoder at_limit;
    at_limit.LimitToAgentBounds(false);
    at_limit.Feed(Header(limit, kVersion, static_cast<uint8_t>(type), 0));
    auto waiting = at_limit.Next();
    ASSERT_TRUE(waiting.ok()) << waiting.status();
    EXPECT_FALSE(waiting->has_value());  // a frame at its bound is fine: waits for the payload

    FrameDecoder over;
    over.LimitToAgentBounds(false);
    over.Feed(Header(limit + 1, kVersion, static_cast<uint8_t>(type), 0));
    auto r = over.Next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(ApiErrorCode(r.status()), "bad_agent_reply");
    EXPECT_NE(Msg(r.status()).find(std::to_string(limit)), std::string::npos) << r.status();
  }
}

TEST(FrameDecoder, GuestSizedResponsesGetTheLargerBoundOnlyWhenAsked) {
  FrameDecoder small;
  small.LimitToAgentBounds(false);
  small.Feed(Header(kMaxSmallResponseBytes + 1, kVersion, 3, 0));
  EXPECT_FALSE(small.Next().ok());

  FrameDecoder large;
  large.LimitToAgentBounds(true);
  large.Feed(Header(kMaxGuestReplyBytes, kVersion, 3, 0));
  ASSERT_TRUE(large.Next().ok());
  FrameDecoder too_large;
  too_large.LimitToAgentBounds(true);
  too_large.Feed(Header(kMaxGuestReplyBytes + 1, kVersion, 3, 0));
  EXPECT_FALSE(too_large.Next().ok());
  // Only the response grows: output from a guest-sized call keeps its own bound.
  FrameDecoder output;
  output.LimitToAgentBounds(true);
  output.Feed(Header(kMaxOutputFrameBytes + 1, kVersion, 4, 0));
  EXPECT_FALSE(output.Next().ok());
}

TEST(FrameDecoder, WithoutAgentBoundsOnlyTheCodecMaximumApplies) {
  FrameDecoder d;  // the agent reading sbxd
  d.Feed(Header(kMaxPayload, kVersion, 2, 0));
  auto r = d.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(GuestSizedOps, AreExactlyProcessesAndList) {
  EXPECT_TRUE(IsGuestSizedOp("processes"));
  EXPECT_TRUE(IsGuestSizedOp("list"));
  for (const char* op : {"status", "stat", "read", "attach", "ping", "", "Processes"}) {
    EXPECT_FALSE(IsGuestSizedOp(op)) << op;
  }
}

TEST(FrameDecoder, WaitsForWholeHeader) {
  FrameDecoder d;
  d.Feed(std::string("\0\0\0", 3));
  auto r = d.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_EQ(d.buffered(), 3u);
}

TEST(Output, RoundTrips) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  OutputEvent ev{0x0102030405060708ull, Stream::kStderr, 0xfffffffffffull, all};
  std::string p = EncodeOutput(ev);
  EXPECT_EQ(p.size(), 17u + 256u);
  EXPECT_EQ(static_cast<uint8_t>(p[0]), 0x01);
  EXPECT_EQ(static_cast<uint8_t>(p[7]), 0x08);
  auto d = DecodeOutput(p);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->event_id, ev.event_id);
  EXPECT_EQ(d->stream, Stream::kStderr);
  EXPECT_EQ(d->offset, ev.offset);
  EXPECT_EQ(d->data, all);

  OutputEvent empty{1, Stream::kStdout, 0, ""};
  auto e = DecodeOutput(EncodeOutput(empty));
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->data.empty());
}

TEST(Output, RejectsShortPayloadAndBadStream) {
  auto r = DecodeOutput(std::string(16, '\0'));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  std::string p = EncodeOutput({1, Stream::kStdout, 0, "x"});
  for (uint8_t bad : {0, 3, 255}) {
    p[8] = static_cast<char>(bad);
    auto s = DecodeOutput(p);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(Msg(s.status()).find("stream"), std::string::npos);
  }
}

TEST(Output, AppendOutputFrameMatchesEncodeFrame) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  std::string out = "prefix";
  AppendOutputFrame(out, 0x0102030405060708ull, Stream::kStderr, 77, all);
  AppendOutputFrame(out, 9, Stream::kStdout, 0, "");
  EXPECT_EQ(out, "prefix" +
                     EncodeFrame(FrameType::kOutput,
                                 EncodeOutput({0x0102030405060708ull, Stream::kStderr, 77, all})) +
                     EncodeFrame(FrameType::kOutput, EncodeOutput({9, Stream::kStdout, 0, ""})));
  FrameDecoder d;
  d.Feed(std::string_view(out).substr(6));
  auto f = d.Next();
  ASSERT_TRUE(f.ok() && f->has_value());
  auto v = DecodeOutputView((*f)->payload);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->event_id, 0x0102030405060708ull);
  EXPECT_EQ(v->stream, Stream::kStderr);
  EXPECT_EQ(v->offset, 77u);
  EXPECT_EQ(v->data, all);
  EXPECT_EQ(v->data.data(), (*f)->payload.data() + 17);  // a view, not a copy
}

TEST(Output, HeaderThenDataIsTheWholeFrame) {
  const std::string data(70000, 'z');  // beyond 16 bits of length
  std::string split = "p";
  AppendOutputFrameHeader(split, 42, Stream::kStdout, 1u << 20, data.size());
  split += data;
  std::string whole = "p";
  AppendOutputFrame(whole, 42, Stream::kStdout, 1u << 20, data);
  EXPECT_EQ(split, whole);
}

TEST(Output, ViewRejectsWhatDecodeRejects) {
  EXPECT_FALSE(DecodeOutputView(std::string(16, '\0')).ok());
  std::string p = EncodeOutput({1, Stream::kStdout, 0, "x"});
  p[8] = 3;
  EXPECT_FALSE(DecodeOutputView(p).ok());
}

TEST(Exit, RoundTrips) {
  ExitEvent code{7, 3, std::nullopt, false, false};
  auto a = DecodeExit(EncodeExit(code));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->event_id, 7u);
  EXPECT_EQ(a->exit_code, 3);
  EXPECT_FALSE(a->signal.has_value());

  ExitEvent sig{9, std::nullopt, "SIGKILL", true, true};
  auto b = DecodeExit(EncodeExit(sig));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->exit_code.has_value());
  EXPECT_EQ(b->signal, "SIGKILL");
  EXPECT_TRUE(b->timed_out);
  EXPECT_TRUE(b->oom_killed);

  auto j = Json::parse(EncodeExit(code));
  EXPECT_TRUE(j["signal"].is_null());
  EXPECT_EQ(j["exit_code"], 3);
}

TEST(Exit, RejectsMalformed) {
  for (const char* bad : {"", "{", "[]", "3", "{}", R"({"event_id":-1})", R"({"event_id":"1"})",
                          R"({"event_id":1,"exit_code":"0"})",
                          R"({"event_id":1,"exit_code":1.5})",
                          R"({"event_id":1,"exit_code":99999999999})",
                          R"({"event_id":1,"signal":9})", R"({"event_id":1,"timed_out":1})",
                          "\xff\xfe"}) {
    auto r = DecodeExit(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Resync, RoundTripsAndRejects) {
  ResyncEvent ev{42, 1000, 2000};
  auto r = DecodeResync(EncodeResync(ev));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->oldest_available_id, 42u);
  EXPECT_EQ(r->stdout_offset, 1000u);
  EXPECT_EQ(r->stderr_offset, 2000u);
  for (const char* bad : {"", "null", R"({"oldest_available_id":1,"stdout_offset":2})",
                          R"({"oldest_available_id":1,"stdout_offset":2,"stderr_offset":-3})"}) {
    EXPECT_FALSE(DecodeResync(bad).ok()) << bad;
  }
}

TEST(Signals, NamesAndNumbers) {
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGWINCH), "SIGWINCH");
  EXPECT_EQ(SignalName(0), std::nullopt);
  EXPECT_EQ(SignalName(64), std::nullopt);
  EXPECT_EQ(SignalNumber("TERM"), SIGTERM);
  EXPECT_EQ(SignalNumber("SIGTERM"), SIGTERM);
  EXPECT_EQ(SignalNumber("sigint"), SIGINT);
  EXPECT_EQ(SignalNumber("SIG"), std::nullopt);
  EXPECT_EQ(SignalNumber(""), std::nullopt);
  EXPECT_EQ(SignalNumber("SIGFOO"), std::nullopt);
  int known = 0;
  for (int s = 1; s < 65; ++s) {
    auto n = SignalName(s);
    if (!n) continue;
    ++known;
    EXPECT_EQ(SignalNumber(*n), s) << *n;
    EXPECT_EQ(SignalNumber(n->substr(3)), s) << *n;
  }
  EXPECT_EQ(known, 30);
}

// A one-shot fake agent on a socketpair-like unix socket, to test AgentConnection.
class FakeAgent {
 public:
  explicit FakeAgent(std::string reply_frames) {
    dir_ = std::filesystem::temp_directory_path() /
           ("protocol_test." + std::to_string(::getpid()) + "." + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "s").string();
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    thread_ = std::thread([this, reply = std::move(reply_frames)] {
      int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) return;
      // Read the host's hello + request.
      FrameDecoder d;
      char buf[4096];
      int frames = 0;
      while (frames < 2) {
        ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        d.Feed(std::string_view(buf, static_cast<size_t>(n)));
        for (;;) {
          auto f = d.Next();
          if (!f.ok() || !f->has_value()) break;
          if ((*f)->type == FrameType::kRequest) request_ = (*f)->payload;
          ++frames;
        }
      }
      if (!reply.empty()) (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      ::close(c);
    });
  }
  ~FakeAgent() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
    std::filesystem::remove_all(dir_);
  }
  const std::string& path() const { return path_; }
  const std::string& request() const { return request_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::string path_;
  int listen_fd_ = -1;
  std::thread thread_;
  std::string request_;
};

std::string AgentHello() {
  return EncodeFrame(FrameType::kHello, R"({"version":1,"role":"agent"})");
}

TEST(AgentConnection, CallReturnsResponse) {
  {
    FakeAgent agent(AgentHello() + EncodeFrame(FrameType::kResponse, R"({"ok":true,"x":1})") +
                    EncodeFrame(FrameType::kOutput, EncodeOutput({1, Stream::kStdout, 0, "hi"})));
    auto conn = AgentConnection::Connect(agent.path(), 2000);
    ASSERT_TRUE(conn.ok()) << conn.status();
    auto r = conn->Call(Json{{"op", "ping"}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)["x"], 1);
    auto f = conn->ReadFrame();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->type, FrameType::kOutput);
    auto eof = conn->ReadFrame();
    ASSERT_FALSE(eof.ok());
    EXPECT_EQ(eof.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(Msg(eof.status()), "agent closed the stream");
    // Moving keeps the buffered state and the socket.
    AgentConnection moved = std::move(*conn);
    EXPECT_FALSE(moved.ReadFrame().ok());
  }
}

TEST(AgentConnection, MapsAgentErrors) {
  struct Case {
    const char* code;
    absl::StatusCode want;
  } cases[] = {{"not_found", absl::StatusCode::kNotFound},
               {"invalid_argument", absl::StatusCode::kInvalidArgument},
               {"failed_precondition", absl::StatusCode::kFailedPrecondition},
               {"weird_code", absl::StatusCode::kInternal}};
  for (const auto& c : cases) {
    Json resp = {{"ok", false}, {"error", {{"code", c.code}, {"message", "boom"}}}};
    FakeAgent agent(AgentHello() + EncodeFrame(FrameType::kResponse, resp.dump()));
    auto r = CallAgent(agent.path(), Json{{"op", "status"}, {"session_id", "s"}}, 2000);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.want) << c.code;
    EXPECT_EQ(Msg(r.status()), fmt::format("agent: {}: boom", c.code));
  }
}

TEST(AgentConnection, ReportsGarbageAndTimeouts) {
  {
    FakeAgent agent(AgentHello() + EncodeFrame(FrameType::kResponse, "not json"));
    auto r = CallAgent(agent.path(), Json{{"op", "ping"}}, 2000);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    FakeAgent agent(Header(0, 3, 1, 0));
    auto r = CallAgent(agent.path(), Json{{"op", "ping"}}, 2000);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(Msg(r.status()).find("version 3"), std::string::npos) << r.status();
  }
  {
    FakeAgent agent("");
    auto r = CallAgent(agent.path(), Json{{"op", "ping"}}, 2000);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  }
  auto missing = CallAgent("/nonexistent/dir/agent.sock", Json{{"op", "ping"}}, 100);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(missing.status()).find("connect("), std::string::npos);
  auto too_long = AgentConnection::Connect(std::string(200, 'a'), 100);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AgentConnection, ReadTimesOut) {
  auto dir = std::filesystem::temp_directory_path() / ("protocol_test.to." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "s").string();
  int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(l, 4), 0);
  // Never accepted: connect succeeds through the backlog, the read times out.
  auto r = CallAgent(path, Json{{"op", "ping"}}, 200);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  ::close(l);
  std::filesystem::remove_all(dir);
}

TEST(ErrorCodeNames, RoundTripAndUnknownIsInternal) {
  for (absl::StatusCode c : {absl::StatusCode::kNotFound, absl::StatusCode::kInvalidArgument,
                             absl::StatusCode::kFailedPrecondition,
                             absl::StatusCode::kResourceExhausted, absl::StatusCode::kOutOfRange,
                             absl::StatusCode::kUnavailable}) {
    EXPECT_EQ(ErrorCodeFromName(ErrorCodeName(c)), c) << ErrorCodeName(c);
  }
  EXPECT_EQ(ErrorCodeName(absl::StatusCode::kDataLoss), "internal");
  EXPECT_EQ(ErrorCodeFromName("no_such_code"), absl::StatusCode::kInternal);
  EXPECT_EQ(ErrorCodeFromName(""), absl::StatusCode::kInternal);
}

// Issue 13: payloads from the other side of the socket are depth-checked before a tree exists.
TEST(ParseObjectPayload, RefusesDeepPayloads) {
  const std::string deep = std::string(400000, '[') + std::string(400000, ']');
  auto r = ParseObjectPayload(R"({"ok":true,"entries":)" + deep + "}", "agent response");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("agent response: JSON nests deeper than 64"),
            std::string::npos)
      << r.status();
  EXPECT_FALSE(DecodeExit(R"({"event_id":1,"exit_code":)" + deep + "}").ok());
  EXPECT_FALSE(DecodeResync(R"({"oldest_available_id":)" + deep + "}").ok());
  auto at_limit = ParseObjectPayload(
      R"({"x":)" + std::string(63, '[') + std::string(63, ']') + "}", "payload");
  EXPECT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_FALSE(ParseObjectPayload("[1]", "payload").ok());
}

TEST(PayloadFields, WrongTypesFallBackInsteadOfThrowing) {
  const Json j = Json::parse(R"({"ok":"yes","state":5,"started":"no","error":[1]})");
  EXPECT_FALSE(ResponseOk(j));
  EXPECT_EQ(StringField(j, "state", "none"), "none");
  EXPECT_TRUE(BoolField(j, "started", true));
  EXPECT_EQ(StringField(j["error"], "code", "internal"), "internal");  // not an object
  const Json good = Json::parse(R"({"ok":true,"state":"running","started":false})");
  EXPECT_TRUE(ResponseOk(good));
  EXPECT_EQ(StringField(good, "state"), "running");
  EXPECT_FALSE(BoolField(good, "started", true));
}

}  // namespace
}  // namespace sbx::protocol
