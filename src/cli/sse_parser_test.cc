#include "cli/sse_parser.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sbx::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::FieldsAre;

// Feeds `input` cut at every position in `cuts` and returns the events.
std::vector<SseEvent> FeedInPieces(std::string_view input, const std::vector<size_t>& cuts,
                                   SseParser* parser = nullptr) {
  SseParser local;
  SseParser& p = parser ? *parser : local;
  std::vector<SseEvent> out;
  size_t prev = 0;
  for (size_t c : cuts) {
    EXPECT_TRUE(p.Feed(input.substr(prev, c - prev), &out).ok());
    prev = c;
  }
  EXPECT_TRUE(p.Feed(input.substr(prev), &out).ok());
  return out;
}

std::vector<SseEvent> FeedBytewise(std::string_view input, SseParser* parser = nullptr) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < input.size(); ++i) cuts.push_back(i);
  return FeedInPieces(input, cuts, parser);
}

constexpr std::string_view kStream =
    "id: 1\nevent: stdout\ndata: {\"data_b64\":\"aGk=\",\"offset\":0}\n\n"
    ": keepalive\n\n"
    "id: 2\nevent: process_exited\ndata: {\"exit_code\":0}\n\n";

TEST(SseParser, WholeStream) {
  SseParser p;
  std::vector<SseEvent> out;
  ASSERT_TRUE(p.Feed(kStream, &out).ok());
  EXPECT_THAT(out, ElementsAre(FieldsAre("1", "stdout", "{\"data_b64\":\"aGk=\",\"offset\":0}"),
                               FieldsAre("2", "process_exited", "{\"exit_code\":0}")));
  EXPECT_EQ(p.comments(), 1u);
  EXPECT_FALSE(p.HasPartialEvent());
}

TEST(SseParser, EveryChunkBoundaryGivesTheSameEvents) {
  SseParser whole;
  std::vector<SseEvent> expected;
  ASSERT_TRUE(whole.Feed(kStream, &expected).ok());
  for (size_t a = 0; a <= kStream.size(); ++a) {
    for (size_t b = a; b <= kStream.size(); b += 7) {
      auto got = FeedInPieces(kStream, {a, b});
      ASSERT_EQ(got.size(), expected.size()) << "cuts " << a << "," << b;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].id, expected[i].id);
        EXPECT_EQ(got[i].type, expected[i].type);
        EXPECT_EQ(got[i].data, expected[i].data);
      }
    }
  }
  EXPECT_EQ(FeedBytewise(kStream).size(), expected.size());
}

TEST(SseParser, EventsAreDeliveredAsSoonAsTheyComplete) {
  SseParser p;
  std::vector<SseEvent> out;
  ASSERT_TRUE(p.Feed("id: 1\nevent: stdout\ndata: a\n", &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(p.HasPartialEvent());
  ASSERT_TRUE(p.Feed("\n", &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, "a");
  EXPECT_FALSE(p.HasPartialEvent());
}

TEST(SseParser, CrLfAndCrLineEndings) {
  std::string crlf =
      "id: 7\r\nevent: stderr\r\ndata: x\r\n\r\nid: 8\r\nevent: stdout\r\ndata: y\r\n\r\n";
  std::string cr = "id: 7\revent: stderr\rdata: x\r\rid: 8\revent: stdout\rdata: y\r\r";
  for (const std::string& in : {crlf, cr}) {
    for (auto got : {FeedInPieces(in, {}), FeedBytewise(in)}) {
      EXPECT_THAT(got, ElementsAre(FieldsAre("7", "stderr", "x"), FieldsAre("8", "stdout", "y")))
          << in;
    }
  }
  // A CRLF split exactly between CR and LF must not produce an extra blank line, which would
  // dispatch the event early.
  auto got = FeedInPieces("data: a\r\ndata: b\r\n\r\n", {8});
  EXPECT_THAT(got, ElementsAre(FieldsAre("", "message", "a\nb")));
}

TEST(SseParser, MixedLineEndings) {
  auto got = FeedBytewise("data: 1\ndata: 2\r\ndata: 3\r\n\n");
  EXPECT_THAT(got, ElementsAre(FieldsAre("", "message", "1\n2\n3")));
}

TEST(SseParser, CommentsAndUnknownFieldsAreIgnored) {
  SseParser p;
  auto got = FeedBytewise(": hello\n:\nfoo: bar\nevent: stdout\n: mid-event comment\ndata: z\n\n",
                          &p);
  EXPECT_THAT(got, ElementsAre(FieldsAre("", "stdout", "z")));
  EXPECT_EQ(p.comments(), 3u);
}

TEST(SseParser, MultiLineData) {
  auto got = FeedBytewise("event: x\ndata: line1\ndata:line2\ndata\ndata:  spaced\n\n");
  EXPECT_THAT(got, ElementsAre(FieldsAre("", "x", "line1\nline2\n\n spaced")));
}

TEST(SseParser, FieldWithoutValueAndColonInValue) {
  auto got = FeedBytewise("data: {\"a\": \"b:c\"}\n\ndata\n\n");
  EXPECT_THAT(got, ElementsAre(FieldsAre("", "message", "{\"a\": \"b:c\"}"),
                               FieldsAre("", "message", "")));
}

TEST(SseParser, IdPersistsAndEventTypeResets) {
  auto got = FeedBytewise("id: 5\nevent: stdout\ndata: a\n\ndata: b\n\nid\ndata: c\n\n");
  EXPECT_THAT(got, ElementsAre(FieldsAre("5", "stdout", "a"), FieldsAre("5", "message", "b"),
                               FieldsAre("", "message", "c")));
}

TEST(SseParser, EventWithoutDataIsNotDispatched) {
  SseParser p;
  auto got = FeedBytewise("id: 3\nevent: stdout\n\ndata: x\n\n", &p);
  EXPECT_THAT(got, ElementsAre(FieldsAre("3", "message", "x")));
  EXPECT_EQ(p.last_event_id(), "3");
}

TEST(SseParser, IncompleteEventAtEndIsReportedNotDispatched) {
  SseParser p;
  auto got = FeedBytewise("id: 1\nevent: stdout\ndata: a\n\nid: 2\nevent: process_exited\ndata: {",
                          &p);
  EXPECT_THAT(got, ElementsAre(FieldsAre("1", "stdout", "a")));
  EXPECT_TRUE(p.HasPartialEvent());
}

TEST(SseParser, ByteOrderMarkIsSkippedEvenWhenSplit) {
  std::string in = "\xEF\xBB\xBF" "data: a\n\n";
  EXPECT_THAT(FeedBytewise(in), ElementsAre(FieldsAre("", "message", "a")));
  EXPECT_THAT(FeedInPieces(in, {2}), ElementsAre(FieldsAre("", "message", "a")));
  // Only at the very start.
  EXPECT_THAT(FeedBytewise("data: a\n\n\xEF\xBB\xBF" "data: b\n\n"),
              ElementsAre(FieldsAre("", "message", "a")));
}

TEST(SseParser, RetryField) {
  SseParser p;
  std::vector<SseEvent> out;
  ASSERT_TRUE(p.Feed("retry: 1500\n\nretry: x\n\n", &out).ok());
  EXPECT_EQ(p.retry_ms(), 1500u);
  EXPECT_TRUE(out.empty());
}

TEST(SseParser, BinarySafeData) {
  std::string in = "data: a";
  in.push_back('\0');
  in += "\xff\n\n";
  auto got = FeedBytewise(in);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, std::string("a\0\xff", 3));
}

TEST(SseParser, OverlongLineIsAnError) {
  SseParser p(16);
  std::vector<SseEvent> out;
  EXPECT_TRUE(p.Feed("data: 0123456789", &out).ok());
  EXPECT_FALSE(p.Feed("abcdef", &out).ok());
}

TEST(SseParser, LargeDataAcrossManyChunks) {
  std::string payload(200000, 'q');
  std::string in = "id: 9\nevent: stdout\ndata: " + payload + "\n\n";
  std::vector<size_t> cuts;
  for (size_t i = 4093; i < in.size(); i += 4093) cuts.push_back(i);
  auto got = FeedInPieces(in, cuts);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, payload);
}

// A data line cut by a read goes straight into the event's data (not through the line
// buffer): the result must not depend on where the cut falls, around the field name above all
// ("data" then ":" then the optional space), nor take a field that only starts with "data".
TEST(SseParser, DataLinesCutAnywhereGiveTheSameEvents) {
  const std::string long_value(300, 'v');
  const std::string in = "data:x\n"
                         "data:  two spaces, one dropped\r\n"
                         "datax: not data\n"
                         "data\n"
                         "data:\n"
                         "data: " + long_value + "\r\n\r\n"
                         "id: 3\ndata: " + long_value + "\n\n"
                         "data:" + long_value + "\r\r";
  SseParser whole;
  std::vector<SseEvent> expected;
  ASSERT_TRUE(whole.Feed(in, &expected).ok());
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(expected[0].data, "x\n two spaces, one dropped\n\n\n" + long_value);
  EXPECT_THAT(expected[1], FieldsAre("3", "message", long_value));
  EXPECT_THAT(expected[2], FieldsAre("3", "message", long_value));
  for (size_t a = 0; a <= in.size(); ++a) {
    for (size_t b = a; b <= in.size(); b += 5) {
      SseParser p;
      auto got = FeedInPieces(in, {a, b}, &p);
      ASSERT_EQ(got.size(), expected.size()) << "cuts " << a << "," << b;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_THAT(got[i], FieldsAre(expected[i].id, expected[i].type, expected[i].data))
            << "cuts " << a << "," << b;
      }
      EXPECT_FALSE(p.HasPartialEvent());
    }
  }
}

// Many short data lines without the blank line that ends the event: bounded like one line.
TEST(SseParser, DataLinesAddingUpPastTheBoundAreAnError) {
  for (size_t step : {size_t{1}, size_t{5}, size_t{1000}}) {
    SseParser p(16);
    std::vector<SseEvent> out;
    const std::string in = "data: 01234\ndata: 56789\ndata: abcde\ndata: fghij\n";
    absl::Status st;
    for (size_t at = 0; at < in.size() && st.ok(); at += step) {
      st = p.Feed(std::string_view(in).substr(at, step), &out);
    }
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << step;
    EXPECT_TRUE(out.empty());
  }
  SseParser fits(16);  // the same bytes as separate events are fine
  std::vector<SseEvent> out;
  EXPECT_TRUE(fits.Feed("data: 01234\n\ndata: 56789\n\ndata: abcde\n\n", &out).ok());
  EXPECT_EQ(out.size(), 3u);
}

TEST(SseParser, StreamEndingInsideADataLineIsPartial) {
  SseParser p;
  std::vector<SseEvent> out;
  ASSERT_TRUE(p.Feed("data: first\n\ndata: abcdefgh", &out).ok());
  ASSERT_TRUE(p.Feed("ijk", &out).ok());
  EXPECT_THAT(out, ElementsAre(FieldsAre("", "message", "first")));
  EXPECT_TRUE(p.HasPartialEvent());
}

TEST(SseParser, OverlongLineOfAnyFieldIsAnErrorAcrossReads) {
  for (std::string_view field : {"data: ", "data:", "event: ", "id: ", "dat"}) {
    SseParser p(16);
    std::vector<SseEvent> out;
    std::string first = std::string(field) + std::string(16 - field.size(), 'a');
    EXPECT_TRUE(p.Feed(first, &out).ok()) << field;
    EXPECT_FALSE(p.Feed("b", &out).ok()) << field;
  }
}

// The callback form hands out one event object whose buffers are reused: a long event then
// short ones must not leak bytes, a type or an id from the event before.
TEST(SseParser, CallbackEventsReuseBuffersWithoutLeakingTheLastEvent) {
  const std::string big(300000, 'z');
  const std::string in = "id: 1\nevent: stdout\ndata: " + big + "\n\n" +
                         "data: a\n\n" +
                         "event: stderr\ndata: bc\ndata: d\n\n" +
                         "id: 7\ndata: " + big.substr(0, 5000) + "\n\n" +
                         "data: \n\n";
  for (size_t step : {size_t{1} << 20, size_t{65536}, size_t{4093}, size_t{7}}) {
    SseParser p;
    std::vector<SseEvent> got;
    for (size_t at = 0; at < in.size(); at += step) {
      ASSERT_TRUE(p.Feed(std::string_view(in).substr(at, step),
                         [&](const SseEvent& e) { got.push_back(e); })
                      .ok());
    }
    ASSERT_EQ(got.size(), 5u) << step;
    EXPECT_THAT(got[0], FieldsAre("1", "stdout", big));
    EXPECT_THAT(got[1], FieldsAre("1", "message", "a"));
    EXPECT_THAT(got[2], FieldsAre("1", "stderr", "bc\nd"));
    EXPECT_THAT(got[3], FieldsAre("7", "message", big.substr(0, 5000)));
    EXPECT_THAT(got[4], FieldsAre("7", "message", ""));
    EXPECT_FALSE(p.HasPartialEvent());
  }
}

// One binary-form event (docs/api.md): kind, 3 zero bytes, u32 length, u64 id, u64 offset.
std::string BinaryEvent(uint8_t kind, uint64_t id, uint64_t offset, std::string_view payload) {
  std::string out(1, static_cast<char>(kind));
  out.append(3, '\0');
  auto be = [&](uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  be(payload.size(), 4);
  be(id, 8);
  be(offset, 8);
  out.append(payload);
  return out;
}

TEST(BinaryAttachParser, EveryChunkBoundaryGivesTheSameEvents) {
  const std::string stream = BinaryEvent(1, 7, 0, "hi\n") + BinaryEvent(0, 0, 0, "") +
                             BinaryEvent(2, 8, 0, std::string(300, '\xff')) +
                             BinaryEvent(9, 0, 0, "future kind") +
                             BinaryEvent(3, 0, 0, R"({"oldest_available_id":9})") +
                             BinaryEvent(1, 9, 3, std::string("\0a\0", 3)) +
                             BinaryEvent(5, 10, 0, R"({"exit_code":0})");
  for (size_t a = 0; a <= stream.size(); ++a) {
    for (size_t b = a; b <= stream.size(); b += 13) {
      BinaryAttachParser p;
      std::vector<AttachEvent> got;
      ASSERT_TRUE(p.Feed(std::string_view(stream).substr(0, a), &got).ok());
      ASSERT_TRUE(p.Feed(std::string_view(stream).substr(a, b - a), &got).ok());
      ASSERT_TRUE(p.Feed(std::string_view(stream).substr(b), &got).ok());
      EXPECT_FALSE(p.HasPartialEvent());
      ASSERT_EQ(got.size(), 5u) << a << "," << b;
      EXPECT_EQ(got[0].id, "7");
      EXPECT_EQ(got[0].type, "stdout");
      EXPECT_TRUE(got[0].raw);
      EXPECT_EQ(got[0].data, "hi\n");
      EXPECT_EQ(got[1].type, "stderr");
      EXPECT_EQ(got[1].data, std::string(300, '\xff'));
      // No id of its own: the last one stays, as with SSE.
      EXPECT_EQ(got[2].id, "8");
      EXPECT_EQ(got[2].type, "resync_required");
      EXPECT_FALSE(got[2].raw);
      EXPECT_EQ(got[2].data, R"({"oldest_available_id":9})");
      EXPECT_EQ(got[3].offset, 3u);
      EXPECT_EQ(got[3].data, std::string("\0a\0", 3));
      EXPECT_EQ(got[4].id, "10");
      EXPECT_EQ(got[4].type, "process_exited");
    }
  }
}

TEST(BinaryAttachParser, CallbackEventsReuseBuffersWithoutLeakingTheLastEvent) {
  const std::string stream = BinaryEvent(1, 1, 0, std::string(100000, 'x')) +
                             BinaryEvent(2, 2, 0, "e") + BinaryEvent(3, 0, 0, "{}") +
                             BinaryEvent(1, 3, 100000, "");
  BinaryAttachParser p;
  std::vector<AttachEvent> got;
  for (size_t at = 0; at < stream.size(); at += 4093) {
    ASSERT_TRUE(p.Feed(std::string_view(stream).substr(at, 4093),
                       [&](const AttachEvent& e) { got.push_back(e); })
                    .ok());
  }
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].data, std::string(100000, 'x'));
  EXPECT_THAT(got[1], FieldsAre("2", "stderr", "e", true, 0u));
  EXPECT_THAT(got[2], FieldsAre("2", "resync_required", "{}", false, 0u));
  EXPECT_THAT(got[3], FieldsAre("3", "stdout", "", true, 100000u));
}

TEST(BinaryAttachParser, PartialAndOversizedEvents) {
  BinaryAttachParser p(/*max_event_bytes=*/1024);
  std::vector<AttachEvent> got;
  const std::string ev = BinaryEvent(1, 1, 0, "abc");
  ASSERT_TRUE(p.Feed(std::string_view(ev).substr(0, 10), &got).ok());
  EXPECT_TRUE(p.HasPartialEvent());
  EXPECT_TRUE(got.empty());
  BinaryAttachParser q(/*max_event_bytes=*/1024);
  const std::string big = BinaryEvent(1, 1, 0, std::string(2000, 'x'));
  EXPECT_FALSE(q.Feed(std::string_view(big).substr(0, 100), &got).ok());
}

}  // namespace
}  // namespace sbx::cli
