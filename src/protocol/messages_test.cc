#include "protocol/messages.h"

#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx::protocol {
namespace {

// The wire bytes of the untyped code these types replaced (nlohmann orders keys): both sides
// must keep interoperating.
TEST(MessagesTest, RequestsKeepTheirWireBytes) {
  SessionSpec spec;
  spec.argv = {"sh", "-c", "echo hi"};
  spec.cwd = "/work";
  spec.env = {{"A", "1"}};
  spec.user = "root";
  EXPECT_EQ(EncodeRequest(AttachRequest{"ses_1", 3, spec}),
            R"({"after_event_id":3,"op":"attach","session_id":"ses_1","spec":{"argv":["sh","-c",)"
            R"("echo hi"],"cwd":"/work","env":{"A":"1"},"user":"root"}})");
  spec.tty = TtySize{30, 100};
  spec.stdin_pipe = true;
  spec.timeout_s = 60;
  spec.kill_grace_s = 2;
  EXPECT_EQ(DumpJson(spec.ToJson()),
            R"({"argv":["sh","-c","echo hi"],"cwd":"/work","env":{"A":"1"},"kill_grace_s":2,)"
            R"("stdin":true,"timeout_s":60,"tty":{"cols":100,"rows":30},"user":"root"})");
  EXPECT_EQ(EncodeRequest(StatusRequest{"s"}), R"({"op":"status","session_id":"s"})");
  EXPECT_EQ(EncodeRequest(SignalRequest{"s", 15}), R"({"op":"signal","session_id":"s","signal":15})");
  EXPECT_EQ(EncodeRequest(StdinRequest{"s", "aGk="}),
            R"({"data_b64":"aGk=","op":"stdin","session_id":"s"})");
  EXPECT_EQ(EncodeRequest(StdinCloseRequest{"s"}), R"({"op":"stdin_close","session_id":"s"})");
  EXPECT_EQ(EncodeRequest(ResizeRequest{"s", 24, 80}),
            R"({"cols":80,"op":"resize","rows":24,"session_id":"s"})");
  EXPECT_EQ(EncodeRequest(ProcessesRequest{}), R"({"op":"processes"})");
  EXPECT_EQ(EncodeRequest(ListRequest{"/a", 1}), R"({"depth":1,"op":"list","path":"/a"})");
  EXPECT_EQ(EncodeRequest(MkdirRequest{"/a", true, 0755}),
            R"({"mode":493,"op":"mkdir","parents":true,"path":"/a"})");
  EXPECT_EQ(EncodeRequest(MkdirRequest{"/a", false, std::nullopt, "app"}),
            R"({"op":"mkdir","parents":false,"path":"/a","user":"app"})");
  EXPECT_EQ(EncodeRequest(MoveRequest{"/a", "/b", false}),
            R"({"from":"/a","op":"move","overwrite":false,"to":"/b"})");
  ReadRequest read;
  read.path = "/f";
  read.offset = 5;
  EXPECT_EQ(EncodeRequest(read), R"({"offset":5,"op":"read","path":"/f"})");
  WriteRequest write;
  write.tar = true;
  write.path = "/d";
  write.max_bytes = 10;
  EXPECT_EQ(EncodeRequest(write), R"({"max_bytes":10,"mkdirs":false,"op":"write_tar","path":"/d"})");
  EXPECT_EQ(EncodeRequest(WatchRequest{"/d", true}), R"({"op":"watch","path":"/d","recursive":true})");
}

TEST(MessagesTest, EveryRequestDecodesToWhatWasEncoded) {
  SessionSpec spec;
  spec.argv = {"x"};
  spec.tty = TtySize{};
  const std::vector<Request> requests = {
      PingRequest{}, AttachRequest{"s", 0, spec}, StatusRequest{"s"}, SignalRequest{"s", 9},
      StdinRequest{"s", "YQ=="}, StdinCloseRequest{"s"}, ResizeRequest{"s", 1, 2},
      ProcessesRequest{}, StatRequest{"/"}, ListRequest{"/", std::nullopt},
      MkdirRequest{"/m", false, std::nullopt}, MkdirRequest{"/m", true, 0700, "bob"},
      DeleteRequest{"/d", true},
      MoveRequest{"/a", "/b", true}, ReadRequest{true, "/t", {}, {}, {}},
      WriteRequest{false, "/w", 0644, 1, 2, "bob", true, 100}, WatchRequest{"/w", false},
      ExportLayerRequest{1000}};
  for (const Request& r : requests) {
    const std::string wire = std::visit([](const auto& v) { return EncodeRequest(v); }, r);
    auto back = DecodeRequest(wire);
    ASSERT_TRUE(back.ok()) << wire << ": " << back.status();
    EXPECT_EQ(OpOf(*back), OpOf(r));
    EXPECT_EQ(std::visit([](const auto& v) { return EncodeRequest(v); }, *back), wire);
  }
}

TEST(MessagesTest, DecodeNamesTheBadField) {
  auto bad = [](std::string_view payload) {
    auto r = DecodeRequest(payload);
    EXPECT_FALSE(r.ok()) << payload;
    return std::string(r.status().message());
  };
  EXPECT_NE(bad(R"({"op":"stat","path":7})").find("\"path\""), std::string::npos);
  EXPECT_NE(bad(R"({"op":"resize","session_id":"s","rows":0,"cols":1})").find("\"rows\""),
            std::string::npos);
  EXPECT_NE(bad(R"({"op":"attach","session_id":"s","spec":{"argv":[]}})").find("\"argv\""),
            std::string::npos);
  EXPECT_NE(bad(R"({"op":"attach","session_id":"s","spec":{"argv":["a"],"timeout_s":0}})")
                .find("\"timeout_s\""),
            std::string::npos);
  EXPECT_NE(bad(R"({"op":"attach","session_id":"","spec":{"argv":["a"]}})").find("session_id"),
            std::string::npos);
  EXPECT_NE(bad(R"({"op":"signal","session_id":"s","signal":"NOPE"})").find("\"signal\""),
            std::string::npos);
  EXPECT_NE(bad(R"({"op":7})").find("op"), std::string::npos);
  EXPECT_NE(bad(R"({"op":"export_layer","max_entries":0})").find("\"max_entries\""),
            std::string::npos);
  EXPECT_NE(bad(R"({"op":"export_layer","max_entries":"9"})").find("\"max_entries\""),
            std::string::npos);
  EXPECT_EQ(DecodeRequest(R"({"op":"dance"})").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(DecodeRequest("[1]").ok());
}

TEST(MessagesTest, ExportLayerDefaultsAndItsEnd) {
  auto r = DecodeRequest(R"({"op":"export_layer"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::get<ExportLayerRequest>(*r).max_entries, UINT64_MAX);
  auto end = ExportLayerEnd::FromJson(ExportLayerEnd{3, 2048}.ToJson());
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->entries, 3u);
  EXPECT_EQ(end->tar_bytes, 2048u);
  EXPECT_FALSE(ExportLayerEnd::FromJson(Json::parse(R"({"ok":true,"entries":-1,"tar_bytes":0})")).ok());
  EXPECT_FALSE(ExportLayerEnd::FromJson(Json::parse(R"({"ok":true,"entries":1})")).ok());
}

TEST(MessagesTest, SignalsDecodeFromNumbersAndNames) {
  auto sig = [](std::string_view payload) {
    auto r = DecodeRequest(payload);
    return r.ok() ? std::get<SignalRequest>(*r).signal : -1;
  };
  EXPECT_EQ(sig(R"({"op":"signal","session_id":"s","signal":15})"), 15);
  EXPECT_EQ(sig(R"({"op":"signal","session_id":"s","signal":"TERM"})"), 15);
  EXPECT_EQ(sig(R"({"op":"signal","session_id":"s","signal":"SIGKILL"})"), 9);
  EXPECT_EQ(sig(R"({"op":"signal","session_id":"s","signal":0})"), -1);
  EXPECT_EQ(sig(R"({"op":"signal","session_id":"s","signal":-3})"), -1);
}

TEST(MessagesTest, SpecAcceptsTtyTrueAndNulls) {
  auto spec = SessionSpec::FromJson(
      Json::parse(R"({"argv":["a"],"cwd":null,"env":null,"tty":true,"stdin":null})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tty, TtySize{});
  EXPECT_EQ(spec->cwd, "");
  auto no_tty = SessionSpec::FromJson(Json::parse(R"({"argv":["a"],"tty":false})"));
  ASSERT_TRUE(no_tty.ok());
  EXPECT_FALSE(no_tty->tty);
  EXPECT_FALSE(SessionSpec::FromJson(Json::parse(R"({"argv":["a"],"env":{"A=B":"x"}})")).ok());
  EXPECT_FALSE(SessionSpec::FromJson(Json::parse(R"({"argv":["a"],"tty":{"rows":0}})")).ok());
}

TEST(MessagesTest, RepliesDecodeAndErrorsBecomeStatuses) {
  auto status = DecodeReply<StatusReply>(
      R"({"ok":true,"state":"exited","pid":7,"exit_code":3,"signal":null,"started_at":"t",)"
      R"("exited_at":"u","oom_killed":false,"timed_out":true,"tty":false,"stdin":true})",
      "status reply");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state, "exited");
  EXPECT_EQ(status->exit_code, 3);
  EXPECT_TRUE(status->timed_out);
  EXPECT_EQ(status->stdin_pipe, true);

  auto err = DecodeReply<EntryReply>(
      R"({"ok":false,"error":{"code":"not_found","message":"gone","reason":"no_such_file"}})",
      "stat reply");
  EXPECT_EQ(err.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ApiErrorCode(err.status()), "no_such_file");

  auto wrong = DecodeReply<EntryReply>(R"({"ok":true,"entry":{"size":"big"}})", "stat reply");
  EXPECT_EQ(ApiErrorCode(wrong.status()), "bad_agent_reply");
  EXPECT_FALSE(DecodeReply<StatusReply>("{", "status reply").ok());

  FileEntry e{"f", "/f", "symlink", 3, 0777, 0, 0, "2026-01-01T00:00:00Z", "/t"};
  auto entry = DecodeReply<EntryReply>(DumpJson(EntryReply{e}.ToJson()), "x");
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_EQ(entry->entry, e);
  EXPECT_EQ(DumpJson(ErrorReply::FromStatus(absl::NotFoundError("m")).ToJson()),
            R"({"error":{"code":"not_found","message":"m"},"ok":false})");
}

}  // namespace
}  // namespace sbx::protocol
