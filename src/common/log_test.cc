#include "common/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace sbx::log {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string Json(std::string_view s) {
  std::string out;
  AppendJsonString(out, s);
  return out;
}

std::string Text(std::string_view s) {
  std::string out;
  AppendTextEscaped(out, s);
  return out;
}

// What a JSON parser reads back from the escaped form.
std::string RoundTrip(std::string_view s) { return json::parse(Json(s)).get<std::string>(); }

TEST(LogFormat, JsonEscapesWhatJsonRequires) {
  EXPECT_EQ(Json("plain"), "\"plain\"");
  EXPECT_EQ(Json("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(Json("l1\nl2\r\t\b\f"), R"("l1\nl2\r\t\b\f")");
  EXPECT_EQ(Json(std::string("nul\0x", 5)), R"("nul\u0000x")");
  EXPECT_EQ(Json("\x1b[31mred"), R"("\u001b[31mred")");
  EXPECT_EQ(Json("del\x7f"), R"("del\u007f")");
  // C1 controls (U+009B is a one-byte CSI on some terminals) are escaped too.
  EXPECT_EQ(Json("\xC2\x9B" "2J"), R"("\u009b2J")");
  // Well-formed UTF-8 passes through unchanged.
  EXPECT_EQ(Json("é€😀\xC2\xA0"), "\"é€😀\xC2\xA0\"");
  EXPECT_EQ(RoundTrip("é€😀 \n \x01"), "é€😀 \n \x01");
}

TEST(LogFormat, JsonReplacesInvalidUtf8) {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in;
    std::string want;  // decoded
  } cases[] = {
      {"a\x80z", "a" + fffd + "z"},               // lone continuation byte
      {"a\xC0\xAFz", "a" + fffd + fffd + "z"},    // overlong lead C0, then a continuation
      {"a\xE0\x80\xAFz", "a" + fffd + fffd + fffd + "z"},  // overlong 3-byte
      {"a\xED\xA0\x80z", "a" + fffd + fffd + fffd + "z"},  // UTF-16 surrogate
      {"a\xF4\x90\x80\x80z", "a" + fffd + fffd + fffd + fffd + "z"},  // above U+10FFFF
      {"a\xF5z", "a" + fffd + "z"},
      {"a\xFFz", "a" + fffd + "z"},
      {"a\xE2\x82z", "a" + fffd + "z"},           // truncated: one replacement (maximal subpart)
      {"a\xE2\x82", "a" + fffd},                  // truncated at the end of the string
      {"a\xF0\x9F\x98", "a" + fffd},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(RoundTrip(c.in), c.want) << Json(c.in);
  }
}

// Any bytes at all: one line, valid JSON (nlohmann rejects invalid UTF-8), and exactly the
// input back when the input was valid UTF-8 to begin with.
TEST(LogFormat, RandomBytesAlwaysMakeOneValidJsonLine) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> len(0, 40), byte(0, 255), pick(0, 3);
  const std::string alphabet[] = {"\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xC3\xA9", "\x80",
                                  "\xED\xA0\x80", "\xC2\x9B", "\n", "\"", "\\"};
  for (int iter = 0; iter < 5000; ++iter) {
    std::string msg;
    for (int n = len(rng); n > 0; --n) {
      if (pick(rng) == 0) {
        msg += alphabet[static_cast<size_t>(byte(rng)) % std::size(alphabet)];
      } else {
        msg += static_cast<char>(byte(rng));
      }
    }
    std::string line;
    const Field fields[] = {{"request_id", msg}, {"tenant", ""}};
    const Attr attrs[] = {Attr("path", msg), Attr("status", 200), Attr("duration_ms", 1.5)};
    AppendRecord(line, Format::kJson,
                 Record{std::chrono::system_clock::now(), "info", msg, fields, attrs});
    ASSERT_EQ(line.back(), '\n');
    ASSERT_EQ(line.find('\n'), line.size() - 1) << line;
    json j;
    ASSERT_NO_THROW(j = json::parse(line)) << line;
    EXPECT_FALSE(j.contains("tenant"));
    EXPECT_EQ(j["status"], 200);
    bool valid_utf8 = true;
    try {
      (void)json(msg).dump();
    } catch (const json::exception&) {
      valid_utf8 = false;
    }
    if (valid_utf8) {
      EXPECT_EQ(j["msg"].get<std::string>(), msg);
      // An empty field is left out, like the empty tenant.
      if (!msg.empty()) {
        EXPECT_EQ(j["request_id"].get<std::string>(), msg);
      }
    }

    std::string text;
    AppendRecord(text, Format::kText,
                 Record{std::chrono::system_clock::now(), "info", msg, fields, attrs});
    ASSERT_EQ(text.find('\n'), text.size() - 1);
    for (size_t i = 0; i + 1 < text.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      ASSERT_TRUE(c >= 0x20 && c != 0x7f) << "control byte " << int(c) << " in " << text;
      if (c == 0xC2) {
        ASSERT_GE(static_cast<unsigned char>(text[i + 1]), 0xA0) << "C1 in " << text;
      }
    }
  }
}

TEST(LogFormat, TextEscapesControlsAndBadBytes) {
  EXPECT_EQ(Text("ok é"), "ok é");
  EXPECT_EQ(Text("a\nb\tc\x1b[2J"), "a\\nb\\tc\\x1b[2J");
  EXPECT_EQ(Text("bad\xFF\xE2\x82!"), "bad\\xff\\xe2\\x82!");
  EXPECT_EQ(Text("\xC2\x9B"), "\\u009b");
}

TEST(LogFormat, Timestamp) {
  using namespace std::chrono;
  // 2026-11-30T14:00:00Z
  const sys_seconds base = sys_days{year{2026} / 11 / 30} + hours{14};
  std::string out;
  AppendTimestamp(out, base + milliseconds{123});
  EXPECT_EQ(out, "2026-11-30T14:00:00.123Z");
  out.clear();
  AppendTimestamp(out, base + milliseconds{7});  // same second: the cached prefix
  EXPECT_EQ(out, "2026-11-30T14:00:00.007Z");
  out.clear();
  AppendTimestamp(out, base + hours{10} + minutes{1} + seconds{2} + milliseconds{999});
  EXPECT_EQ(out, "2026-12-01T00:01:02.999Z");
}

TEST(LogFormat, RecordShapes) {
  using namespace std::chrono;
  const auto t = sys_days{year{2026} / 11 / 30} + hours{14} + milliseconds{123};
  const Field fields[] = {{"request_id", "req_1"}, {"tenant", ""}, {"sandbox", "sbx_2"}};
  const Attr attrs[] = {Attr("method", "GET"), Attr("status", 404), Attr("duration_ms", 0.25)};
  std::string j, x;
  AppendRecord(j, Format::kJson, Record{t, "info", "GET /x 404", fields, attrs});
  EXPECT_EQ(j,
            R"({"ts":"2026-11-30T14:00:00.123Z","level":"info","msg":"GET /x 404",)"
            R"("request_id":"req_1","sandbox":"sbx_2","method":"GET","status":404,)"
            R"("duration_ms":0.250})"
            "\n");
  const Field spaced[] = {{"request_id", "has space"}, {"tenant", "t=1"}};
  AppendRecord(x, Format::kText, Record{t, "warning", "m", spaced, attrs}, "\x1b[33m");
  EXPECT_EQ(x,
            "2026-11-30T14:00:00.123Z \x1b[33mwarning\x1b[m m request_id=\"has space\" "
            "tenant=\"t=1\"\n");
}

TEST(LogFormat, ParseOptions) {
  EXPECT_EQ(*ParseFormat("auto", true), Format::kText);
  EXPECT_EQ(*ParseFormat("auto", false), Format::kJson);
  EXPECT_EQ(*ParseFormat("text", false), Format::kText);
  EXPECT_FALSE(ParseFormat("xml", false).ok());
  EXPECT_EQ(*ParseLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(*ParseLevel("error"), spdlog::level::err);
  // spdlog's own from_str turns anything unknown into "off"; we refuse it instead.
  EXPECT_FALSE(ParseLevel("verbose").ok());
}

// Logs into a fresh file through the real default logger.
class LogFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sbx-log-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "sbxd.log").string();
    ASSERT_TRUE(Init(Options{"json", "info", path_}).ok());
  }
  void TearDown() override {
    ASSERT_TRUE(Init(Options{"json", "info", ""}).ok());  // back to stderr, closing the file
    fs::remove_all(dir_);
  }

  static std::vector<json> Lines(const std::string& path) {
    std::ifstream f(path);
    std::vector<json> out;
    for (std::string line; std::getline(f, line);) {
      try {
        out.push_back(json::parse(line));
      } catch (const json::exception& e) {
        ADD_FAILURE() << "not JSON: " << line;
      }
    }
    return out;
  }
  std::vector<json> Lines() const { return Lines(path_); }

  fs::path dir_;
  std::string path_;
};

TEST_F(LogFileTest, ScopesNestAndInnerFieldsWin) {
  Context outer;
  outer.operation = "op_1";
  outer.sandbox = "sbx_1";
  outer.tenant = "t1";
  {
    Scope a(outer);
    spdlog::info("in outer");
    Context inner;
    inner.sandbox = "sbx_2";
    inner.session = "ses_3";
    {
      Scope b(inner);
      spdlog::warn("in inner {}", 1);
      Context cur = Current();
      EXPECT_EQ(cur.sandbox, "sbx_2");
      EXPECT_EQ(cur.operation, "op_1");
      EXPECT_EQ(cur.session, "ses_3");
    }
    spdlog::info("outer again");
  }
  spdlog::info("no context");
  auto lines = Lines();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["msg"], "in outer");
  EXPECT_EQ(lines[0]["operation"], "op_1");
  EXPECT_EQ(lines[0]["sandbox"], "sbx_1");
  EXPECT_FALSE(lines[0].contains("session"));
  EXPECT_EQ(lines[1]["level"], "warn");
  EXPECT_EQ(lines[1]["msg"], "in inner 1");
  EXPECT_EQ(lines[1]["sandbox"], "sbx_2");
  EXPECT_EQ(lines[1]["operation"], "op_1");
  EXPECT_EQ(lines[1]["tenant"], "t1");
  EXPECT_EQ(lines[1]["session"], "ses_3");
  EXPECT_EQ(lines[2]["sandbox"], "sbx_1");
  EXPECT_FALSE(lines[2].contains("session"));
  for (const char* k : {"request_id", "tenant", "sandbox", "operation", "session"}) {
    EXPECT_FALSE(lines[3].contains(k)) << k;
  }
  EXPECT_TRUE(lines[3]["ts"].is_string());
}

TEST_F(LogFileTest, ExplicitContextAndEventAttributes) {
  Context req;
  req.request_id = "req_9";
  req.tenant = "default";
  SBX_LOG_INFO(req, "handled {}", "x");
  With(req, [] { Event(spdlog::level::info, {{"status", 201}, {"path", "/v1/x"}}, "done"); });
  Event(spdlog::level::info, {{"duration_ms", 2.5}}, "bare");
  auto lines = Lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["request_id"], "req_9");
  EXPECT_EQ(lines[0]["msg"], "handled x");
  EXPECT_EQ(lines[1]["tenant"], "default");
  EXPECT_EQ(lines[1]["status"], 201);
  EXPECT_EQ(lines[1]["path"], "/v1/x");
  EXPECT_FALSE(lines[2].contains("request_id"));
  EXPECT_DOUBLE_EQ(lines[2]["duration_ms"].get<double>(), 2.5);
  EXPECT_FALSE(lines[2].contains("status")) << "attributes belong to their own line only";
}

struct Counted {
  std::atomic<int>* formatted;
};

}  // namespace
}  // namespace sbx::log

template <>
struct fmt::formatter<sbx::log::Counted> : fmt::formatter<std::string_view> {
  auto format(const sbx::log::Counted& c, fmt::format_context& ctx) const {
    c.formatted->fetch_add(1);
    return fmt::formatter<std::string_view>::format("counted", ctx);
  }
};

namespace sbx::log {
namespace {

TEST_F(LogFileTest, NothingIsEvaluatedOrFormattedBelowTheLevel) {
  std::atomic<int> formatted{0};
  int evaluated = 0;
  auto expensive = [&] {
    ++evaluated;
    return std::string("x");
  };
  Context ctx;
  ctx.request_id = "r";
  SBX_LOG_DEBUG(ctx, "{} {}", expensive(), Counted{&formatted});
  Event(spdlog::level::debug, {{"k", 1}}, "{}", Counted{&formatted});
  spdlog::debug("{}", Counted{&formatted});
  EXPECT_EQ(evaluated, 0);
  EXPECT_EQ(formatted.load(), 0);
  EXPECT_TRUE(Lines().empty());

  ASSERT_TRUE(SetLevel("debug").ok());
  SBX_LOG_DEBUG(ctx, "{} {}", expensive(), Counted{&formatted});
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(formatted.load(), 1);
  EXPECT_EQ(Lines().size(), 1u);
  EXPECT_FALSE(SetLevel("loud").ok());
}

TEST_F(LogFileTest, ReopenFollowsTheFileName) {
  spdlog::info("before rotation");
  const std::string rotated = path_ + ".1";
  fs::rename(path_, rotated);
  spdlog::info("after rename, before reopen");  // still the old (renamed) file
  Reopen();
  spdlog::info("after reopen");
  auto old_lines = Lines(rotated);
  auto new_lines = Lines(path_);
  ASSERT_EQ(old_lines.size(), 2u);
  EXPECT_EQ(old_lines[0]["msg"], "before rotation");
  EXPECT_EQ(old_lines[1]["msg"], "after rename, before reopen");
  ASSERT_EQ(new_lines.size(), 2u);
  EXPECT_EQ(new_lines[0]["msg"], "log file " + path_ + " reopened");
  EXPECT_EQ(new_lines[1]["msg"], "after reopen");
}

TEST_F(LogFileTest, ReopenKeepsTheOldFileWhenTheNewOneCannotBeOpened) {
  fs::remove_all(dir_);  // the directory is gone: open(O_CREAT) fails
  Reopen();
  spdlog::info("still logging");
  // Both lines went to the old, now unlinked, file: nothing to read back, but no crash and no
  // write to a closed fd (which the next open could have reused).
  fs::create_directories(dir_);
  Reopen();
  spdlog::info("back");
  auto lines = Lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["msg"], "back");
}

TEST_F(LogFileTest, ThreadsDoNotSeeEachOthersScopes) {
  std::atomic<bool> go{false};
  auto worker = [&](const std::string& id) {
    Context c;
    c.operation = id;
    Scope s(c);
    while (!go) std::this_thread::yield();
    for (int i = 0; i < 200; ++i) spdlog::info("{}", id);
  };
  std::thread a(worker, "op_a"), b(worker, "op_b");
  std::thread none([&] {
    while (!go) std::this_thread::yield();
    for (int i = 0; i < 200; ++i) spdlog::info("none");
  });
  go = true;
  a.join();
  b.join();
  none.join();
  auto lines = Lines();
  ASSERT_EQ(lines.size(), 600u);
  for (const json& l : lines) {
    if (l["msg"] == "none") {
      EXPECT_FALSE(l.contains("operation")) << l.dump();
    } else {
      EXPECT_EQ(l["operation"], l["msg"]) << l.dump();
    }
  }
}

TEST_F(LogFileTest, HugeMessagesAreCutToOneUsableLine) {
  std::string big(200 << 10, 'a');
  big[(16 << 10) - 1] = '\xE2';  // the cut lands inside a UTF-8 sequence
  spdlog::info("{}", big);
  auto lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  const std::string msg = lines[0]["msg"];
  EXPECT_LT(msg.size(), 17u << 10);
  EXPECT_NE(msg.find("more bytes]"), std::string::npos);
}

void CloseOutOfOrder() {
  Context a;
  Context b;
  auto* sa = new Scope(a);
  auto* sb = new Scope(b);
  delete sa;  // sb is still open above it
  delete sb;
}

void CloseOnAnotherThread() {
  Context a;
  auto* s = new Scope(a);
  std::thread([s] { delete s; }).join();  // what a coroutine resumed elsewhere would do
}

TEST(LogScopeDeathTest, ScopeClosedOutOfOrderAborts) {
  EXPECT_DEATH(CloseOutOfOrder(), "destroyed on another thread or out of order");
}

TEST(LogScopeDeathTest, ScopeClosedOnAnotherThreadAborts) {
  EXPECT_DEATH(CloseOnAnotherThread(), "destroyed on another thread or out of order");
}

}  // namespace
}  // namespace sbx::log
