// The pure parts of envd's process service (envd_process.h) and its table.
#include "api/e2b/envd_process.h"

#include <gtest/gtest.h>

#include "api/requests.h"
#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

using nlohmann::json;

TEST(EnvdProcessStart, WhatCommandsRunSendsBecomesAnSbxSession) {
  // Captured from e2b 2.51.0's commands.run("echo hi", {envs, cwd}).
  auto s = ParseStart(json::parse(
      R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},
          "cwd":"/tmp"},"stdin":false})"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->config.cmd, "/bin/bash");
  EXPECT_EQ(s->config.args, (std::vector<std::string>{"-l", "-c", "echo hi"}));
  const json body = SessionBody(*s, std::nullopt, 60000);
  EXPECT_EQ(body, json::parse(R"({"argv":["/bin/bash","-l","-c","echo hi"],"env":{"A":"1"},
      "cwd":"/tmp","stdin":false,"timeout_s":60,"kill_grace_s":0})"));
  // sbx's own parser takes it: every session limit applies.
  auto parsed = ParseCreateSession(body.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->timeout_s, 60);
  EXPECT_FALSE(parsed->tty);
}

TEST(EnvdProcessStart, PtyUserTagAndRoundedTimeout) {
  auto s = ParseStart(json::parse(
      R"({"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm-256color"}},
          "pty":{"size":{"cols":"120","rows":40}},"tag":"shell"})"));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->pty);
  EXPECT_EQ(s->pty->cols, 120);
  EXPECT_EQ(s->tag, "shell");
  const json body = SessionBody(*s, std::string("root"), 1500);
  EXPECT_EQ(body["tty"], json::parse(R"({"rows":40,"cols":120})"));
  EXPECT_EQ(body["user"], "root");
  EXPECT_EQ(body["timeout_s"], 2);  // rounded up; the stream's deadline is exact
  EXPECT_FALSE(SessionBody(*s, std::nullopt, std::nullopt).contains("timeout_s"));
  EXPECT_FALSE(SessionBody(*s, std::nullopt, 0).contains("timeout_s"));
  EXPECT_EQ(SessionBody(*s, std::nullopt, 9999999999)["timeout_s"], 30 * 86400);
  EXPECT_TRUE(ParseCreateSession(body.dump()).ok());
}

TEST(EnvdProcessStart, MalformedIsInvalidArgument) {
  for (const char* bad : {
           R"({})", R"({"process":{}})", R"({"process":{"cmd":7}})",
           R"({"process":{"cmd":"x","args":"y"}})", R"({"process":{"cmd":"x","args":[1]}})",
           R"({"process":{"cmd":"x","envs":{"A":1}}})", R"({"process":{"cmd":"x","cwd":false}})",
           R"({"process":{"cmd":"x"},"pty":{"size":{"cols":0,"rows":1}}})",
           R"({"process":{"cmd":"x"},"pty":{}})", R"({"process":{"cmd":"x"},"stdin":"yes"})",
           R"({"process":{"cmd":"x"},"tag":5})", R"({"process":[]})"}) {
    auto s = ParseStart(json::parse(bad));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // Snake case and an empty cwd (proto3's default) are fine.
  auto s = ParseStart(json::parse(R"({"process":{"cmd":"ls","cwd":""}})"));
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->config.cwd);
}

TEST(EnvdProcessSelector, PidOrTag) {
  auto p = ParseSelector(json::parse(R"({"process":{"pid":"42"}})"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->pid, 42);
  EXPECT_EQ(p->Describe(), "process with pid 42");
  auto t = ParseSelector(json::parse(R"({"process":{"tag":"web"}})"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->tag, "web");
  for (const char* bad : {R"({})", R"({"process":{}})", R"({"process":{"pid":-1}})",
                          R"({"process":{"pid":1.5}})", R"({"process":{"pid":1,"tag":"x"}})",
                          R"({"process":{"tag":1}})", R"({"process":7})"}) {
    EXPECT_EQ(ParseSelector(json::parse(bad)).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(EnvdProcessSignal, NamesAndNumbers) {
  EXPECT_EQ(*ParseSignal(json::parse(R"({"signal":"SIGNAL_SIGKILL"})")), 9);
  EXPECT_EQ(*ParseSignal(json::parse(R"({"signal":"SIGNAL_SIGTERM"})")), 15);
  EXPECT_EQ(*ParseSignal(json::parse(R"({"signal":9})")), 9);
  EXPECT_EQ(*ParseSignal(json::parse(R"({"signal":"15"})")), 15);
  for (const char* bad : {R"({})", R"({"signal":"SIGNAL_UNSPECIFIED"})", R"({"signal":0})",
                          R"({"signal":"SIGNAL_NOPE"})", R"({"signal":99})", R"({"signal":[]})"}) {
    EXPECT_FALSE(ParseSignal(json::parse(bad)).ok()) << bad;
  }
}

TEST(EnvdProcessInput, StandardOrUrlSafeBase64) {
  EXPECT_EQ(*ParseInput(json::parse(R"({"stdin":"aGk/Pz4+"})"), "input"), "hi\x3f?>>");
  EXPECT_EQ(*ParseInput(json::parse(R"({"pty":"aGk_Pz4-"})"), "input"), "hi\x3f?>>");
  EXPECT_EQ(*ParseInput(json::parse(R"({"stdin":"aGk"})"), "input"), "hi");
  EXPECT_EQ(*ParseInput(json::parse(R"({})"), "input"), "");
  EXPECT_FALSE(ParseInput(json::parse(R"({"stdin":"***"})"), "input").ok());
  EXPECT_FALSE(ParseInput(json::parse(R"("x")"), "input").ok());
}

TEST(EnvdProcessEvents, Rendering) {
  EXPECT_EQ(StartEvent(7).dump(), R"({"event":{"start":{"pid":7}}})");
  EXPECT_EQ(DataEvent("stdout", "hi\n").dump(), R"({"event":{"data":{"stdout":"aGkK"}}})");
  EXPECT_EQ(KeepaliveEvent().dump(), R"({"event":{"keepalive":{}}})");
  service::SessionExit ok;
  ok.exit_code = 0;
  EXPECT_EQ(EndEvent(ok), json::parse(
      R"({"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}})"));
  service::SessionExit three;
  three.exit_code = 3;
  EXPECT_EQ(EndEvent(three), json::parse(
      R"({"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3",
                          "error":"exit status 3"}}})"));
  service::SessionExit killed;
  killed.signal = "SIGKILL";
  EXPECT_EQ(EndEvent(killed), json::parse(
      R"({"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed",
                          "error":"signal: killed"}}})"));
  service::SessionExit term;
  term.signal = "SIGTERM";
  EXPECT_EQ(ExitStatusText(term), "signal: terminated");
  service::SessionExit odd;
  odd.signal = "SIGRTMIN";
  EXPECT_EQ(ExitStatusText(odd), "signal: SIGRTMIN");
}

TEST(EnvdProcessSpawn, FailuresReportedByTheAgentsChild) {
  service::SessionExit e127;
  e127.exit_code = 127;
  auto nf = SpawnFailure(e127, "sbx-agent: exec nope: No such file or directory\n");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->code, Code::kNotFound);
  auto denied = SpawnFailure(e127, "sbx-agent: exec /etc: Permission denied\n");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->code, Code::kInvalidArgument);
  service::SessionExit e126;
  e126.exit_code = 126;
  auto cwd = SpawnFailure(e126, "sbx-agent: chdir /nope: No such file or directory\n");
  ASSERT_TRUE(cwd);
  EXPECT_EQ(cwd->code, Code::kInvalidArgument);
  EXPECT_NE(cwd->message.find("cwd '/nope'"), std::string::npos);
  // A process that ran and exited 127 (bash: command not found) is a process.
  EXPECT_FALSE(SpawnFailure(e127, "bash: nope: command not found\n"));
  service::SessionExit zero;
  zero.exit_code = 0;
  EXPECT_FALSE(SpawnFailure(zero, "sbx-agent: exec x: No such file or directory\n"));
  EXPECT_TRUE(MayBeSpawnFailure("sbx-ag"));
  EXPECT_TRUE(MayBeSpawnFailure("sbx-agent: exec"));
  EXPECT_FALSE(MayBeSpawnFailure("bash: x"));
}

TEST(EnvdProcessTimeouts, Headers) {
  EXPECT_EQ(*ParseTimeoutMs(std::nullopt), std::nullopt);
  EXPECT_EQ(**ParseTimeoutMs("60000"), 60000);
  EXPECT_FALSE(ParseTimeoutMs("").ok());
  EXPECT_FALSE(ParseTimeoutMs("-1").ok());
  EXPECT_FALSE(ParseTimeoutMs("12345678901").ok());
  using std::chrono::milliseconds;
  EXPECT_EQ(KeepaliveInterval("50", milliseconds(15000)), milliseconds(15000));
  EXPECT_EQ(KeepaliveInterval("2", milliseconds(15000)), milliseconds(2000));
  EXPECT_EQ(KeepaliveInterval(std::nullopt, milliseconds(15000)), milliseconds(15000));
  EXPECT_EQ(KeepaliveInterval("x", milliseconds(15000)), milliseconds(15000));
  EXPECT_EQ(KeepaliveInterval("0", milliseconds(15000)), milliseconds(15000));
}

TEST(EnvdProcessClientStream, Envelopes) {
  const std::string body = Envelope(0, R"({"start":{"process":{"pid":3}}})") +
                           Envelope(0, R"({"data":{"input":{"stdin":"aGk="}}})") +
                           Envelope(0, R"({"keepalive":{}})") + Envelope(kFlagEndStream, "{}");
  auto msgs = ParseClientStream(body, 10);
  ASSERT_TRUE(msgs.ok()) << msgs.status();
  ASSERT_EQ(msgs->size(), 3u);
  EXPECT_TRUE((*msgs)[2].contains("keepalive"));
  EXPECT_TRUE(ParseClientStream("", 10)->empty());
  EXPECT_FALSE(ParseClientStream(body.substr(0, body.size() - 9), 10).ok());  // truncated
  EXPECT_FALSE(ParseClientStream(body, 2).ok());
  EXPECT_FALSE(ParseClientStream(Envelope(kFlagCompressed, "{}"), 10).ok());
  EXPECT_FALSE(ParseClientStream(Envelope(0, "[]"), 10).ok());
}

TEST(EnvdProcessList, InfoAndStoredSpec) {
  ProcessConfigInfo c{"/bin/bash", {"-l", "-c", "sleep 9"}, {{"A", "1"}}, std::nullopt};
  EXPECT_EQ(ProcessInfoJson(7, c, std::nullopt), json::parse(
      R"({"pid":7,"config":{"cmd":"/bin/bash","args":["-l","-c","sleep 9"],"envs":{"A":"1"}}})"));
  EXPECT_EQ(ProcessInfoJson(7, c, "t")["tag"], "t");
  auto from = ConfigFromSpec(json::parse(R"({"argv":["ls","-l"],"cwd":"/x","env":{"B":"2"}})"));
  EXPECT_EQ(from.cmd, "ls");
  EXPECT_EQ(from.args, std::vector<std::string>{"-l"});
  EXPECT_EQ(from.cwd, "/x");
  EXPECT_EQ(from.envs.at("B"), "2");
  EXPECT_EQ(ConfigFromSpec(json()).cmd, "");
}

TEST(EnvdProcessErrors, GoneProcessIsNotFound) {
  Selector sel{7, std::nullopt};
  EXPECT_EQ(ProcessCallError(absl::NotFoundError("unknown session"), sel).code, Code::kNotFound);
  EXPECT_EQ(ProcessCallError(absl::FailedPreconditionError("signal: session \"x\" has exited"), sel)
                .code,
            Code::kNotFound);
  EXPECT_EQ(ProcessCallError(absl::FailedPreconditionError("started without stdin"), sel).code,
            Code::kFailedPrecondition);
}

TEST(ProcessTable, LookupsReuseAndBound) {
  ProcessTable t(3);
  t.Put({"sbx_a", "ses_1", 10, std::string("web"), std::nullopt, false, 0});
  t.Put({"sbx_a", "ses_2", 11, std::nullopt, std::nullopt, false, 0});
  EXPECT_EQ(t.ByPid("sbx_a", 10)->session_id, "ses_1");
  EXPECT_FALSE(t.ByPid("sbx_b", 10));
  EXPECT_EQ(t.ByTag("sbx_a", "web")->session_id, "ses_1");
  t.Delivered("ses_1", 5);
  t.Delivered("ses_1", 3);
  EXPECT_EQ(t.BySession("ses_1")->delivered, 5u);
  // A reused pid names the new session; the old one is still known by its id.
  t.Put({"sbx_a", "ses_3", 10, std::nullopt, std::nullopt, false, 0});
  EXPECT_EQ(t.ByPid("sbx_a", 10)->session_id, "ses_3");
  EXPECT_TRUE(t.BySession("ses_1"));
  // Re-putting keeps the delivered mark.
  t.Put({"sbx_a", "ses_1", 10, std::string("web"), std::nullopt, false, 0});
  EXPECT_EQ(t.BySession("ses_1")->delivered, 5u);
  // Bounded: the oldest goes.
  t.Put({"sbx_a", "ses_4", 12, std::nullopt, std::nullopt, false, 0});
  EXPECT_EQ(t.size(), 3u);
  for (int i = 0; i < 100; ++i) {
    t.Put({"sbx_a", "ses_x" + std::to_string(i), 100 + i, std::nullopt, std::nullopt, false, 0});
  }
  EXPECT_EQ(t.size(), 3u);
  EXPECT_FALSE(t.ByTag("sbx_a", "web"));
  EXPECT_EQ(t.ByPid("sbx_a", 199)->session_id, "ses_x99");
}

}  // namespace
}  // namespace sbx::api::e2b
