#include "api/attach_events.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/target.h"
#include "common/base64.h"

namespace sbx::api {
namespace {

using Stream = service::OutputStream;

// What Api::Attach sent before the event was built in place: the wire contract.
std::string Reference(uint64_t id, Stream stream, uint64_t offset, std::string_view data) {
  nlohmann::json j = {{"data_b64", Base64Encode(data)}, {"offset", offset}};
  return SseEvent(id, stream == Stream::kStderr ? "stderr" : "stdout", j.dump());
}

TEST(SseOutputEvent, WireFormat) {
  EXPECT_EQ(SseOutputEvent(7, Stream::kStdout, 0, "hi\n"),
            "id: 7\nevent: stdout\ndata: {\"data_b64\":\"aGkK\",\"offset\":0}\n\n");
  EXPECT_EQ(SseOutputEvent(18446744073709551615ull, Stream::kStderr, 18446744073709551615ull, ""),
            "id: 18446744073709551615\nevent: stderr\ndata: "
            "{\"data_b64\":\"\",\"offset\":18446744073709551615}\n\n");
  EXPECT_EQ(SseOutputEvent(0, Stream::kStdout, 3, "h"),
            "event: stdout\ndata: {\"data_b64\":\"aA==\",\"offset\":3}\n\n");
}

TEST(SseOutputEvent, MatchesTheJsonBuiltEventForAnyBytes) {
  std::mt19937_64 rng(7);
  for (size_t n : {0, 1, 2, 3, 4, 5, 63, 64, 65, 4095, 4096, 65536, 65537, 262144}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const uint64_t id = rng() % 1000000 + 1;
    const uint64_t offset = rng();
    for (Stream s : {Stream::kStdout, Stream::kStderr}) {
      EXPECT_EQ(SseOutputEvent(id, s, offset, data), Reference(id, s, offset, data)) << n;
      EXPECT_LE(SseOutputEvent(UINT64_MAX, s, UINT64_MAX, data).size(),
                SseOutputEventSizeBound(n));
    }
  }
}

TEST(SseOutputEvent, AppendsToWhatIsThere) {
  ByteBuffer out;
  out.append(": keepalive\n\n");
  AppendSseOutputEvent(out, 1, Stream::kStdout, 0, "a");
  AppendSseOutputEvent(out, 2, Stream::kStderr, 0, "bc");
  EXPECT_EQ(out.view(), ": keepalive\n\n" + Reference(1, Stream::kStdout, 0, "a") +
                     Reference(2, Stream::kStderr, 0, "bc"));
}

// The binary form's header, byte for byte as docs/api.md draws it.
TEST(BinaryEvent, WireFormat) {
  const std::string ev = BinaryEvent(BinaryKind::kStderr, 0x0102030405060708ull,
                                     0x1112131415161718ull, std::string_view("a\0b", 3));
  const std::string want = std::string("\x02\0\0\0" "\0\0\0\x03", 8) +
                           "\x01\x02\x03\x04\x05\x06\x07\x08" +
                           "\x11\x12\x13\x14\x15\x16\x17\x18" + std::string("a\0b", 3);
  EXPECT_EQ(ev, want);
  EXPECT_EQ(ev.size(), kBinaryHeaderBytes + 3);
}

TEST(BinaryEvent, KeepaliveIsTwentyFourZeroBytes) {
  EXPECT_EQ(BinaryEvent(BinaryKind::kKeepalive, 0, 0, ""), std::string(kBinaryHeaderBytes, '\0'));
}

TEST(BinaryEvent, KindsAreTheDocumentedNumbers) {
  const std::pair<BinaryKind, int> kinds[] = {
      {BinaryKind::kKeepalive, 0}, {BinaryKind::kStdout, 1},         {BinaryKind::kStderr, 2},
      {BinaryKind::kResyncRequired, 3}, {BinaryKind::kError, 4}, {BinaryKind::kProcessExited, 5}};
  for (auto [kind, n] : kinds) {
    EXPECT_EQ(static_cast<uint8_t>(BinaryEvent(kind, 1, 0, "{}")[0]), n);
  }
}

// Header then payload, for any payload: a reader that takes the length from bytes 4-7 finds
// the next header right after the payload, and the offset and id come back as given.
TEST(BinaryEvent, AppendedEventsParseBack) {
  std::mt19937_64 rng(11);
  ByteBuffer buf;
  struct Sent {
    uint64_t id, offset;
    std::string data;
  };
  std::vector<Sent> sent;
  for (size_t n : {0, 1, 2, 4095, 4096, 65536, 262144}) {
    Sent s{rng(), rng(), std::string(n, '\0')};
    for (char& c : s.data) c = static_cast<char>(rng());
    AppendBinaryEvent(buf, BinaryKind::kStdout, s.id, s.offset, s.data);
    sent.push_back(std::move(s));
  }
  const std::string_view out = buf.view();
  auto be = [&](size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(out[at + i]);
    return v;
  };
  size_t at = 0;
  for (const Sent& s : sent) {
    ASSERT_LE(at + kBinaryHeaderBytes, out.size());
    EXPECT_EQ(out[at], 1);
    EXPECT_EQ(be(at + 1, 3), 0u);
    const uint64_t len = be(at + 4, 4);
    EXPECT_EQ(be(at + 8, 8), s.id);
    EXPECT_EQ(be(at + 16, 8), s.offset);
    ASSERT_EQ(len, s.data.size());
    EXPECT_EQ(out.substr(at + kBinaryHeaderBytes, len), s.data);
    at += kBinaryHeaderBytes + len;
  }
  EXPECT_EQ(at, out.size());
}

}  // namespace
}  // namespace sbx::api
