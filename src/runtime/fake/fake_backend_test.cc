#include "runtime/fake/fake_backend.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "protocol/protocol.h"

#ifndef SBX_AGENT_PATH
#error "SBX_AGENT_PATH must point at the sbx-agent binary"
#endif

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using protocol::Json;

class FakeBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = fs::temp_directory_path() / ("sbx-fake-test." + std::to_string(::getpid()));
    fs::remove_all(state_);
    fs::create_directories(state_);
  }
  void TearDown() override {
    // Whatever a failed test left behind.
    (void)FakeBackend(state_.string(), SBX_AGENT_PATH).Sweep({});
    std::error_code ec;
    fs::remove_all(state_, ec);
  }

  static bool Alive(pid_t pid) {
    // A zombie still answers kill(0): look at its state.
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (s.empty()) return false;
    return s[s.rfind(')') + 2] != 'Z';
  }

  // An "eventually" bound, not a claim about speed: generous enough for a loaded 2-core CI
  // host, and it returns as soon as the process is gone.
  static bool GoneWithin(pid_t pid, std::chrono::milliseconds limit = 30s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (Alive(pid)) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }

  SandboxSpec Spec(const std::string& id) {
    SandboxSpec s;
    s.id = id;
    s.env = {{"GREETING", "hi"}};
    return s;
  }

  fs::path state_;
};

// Starts `sh -c script` as a session and returns the pid printed by the script's first line.
pid_t StartBackground(const std::string& socket, const std::string& sid) {
  auto conn = protocol::AgentConnection::Connect(socket, 5000);
  EXPECT_TRUE(conn.ok()) << conn.status();
  Json req = {{"op", "attach"},
              {"session_id", sid},
              {"after_event_id", 0},
              {"spec", {{"argv", {"sh", "-c", "sleep 1000 & echo $!; echo $GREETING; wait"}}}}};
  auto resp = conn->Call(req);
  EXPECT_TRUE(resp.ok()) << resp.status();
  std::string out;
  while (out.find("hi\n") == std::string::npos) {
    auto f = conn->ReadFrame();
    if (!f.ok()) break;
    auto ev = protocol::DecodeOutput(f->payload);
    if (ev.ok()) out += ev->data;
  }
  EXPECT_NE(out.find("\nhi\n"), std::string::npos) << out;
  return static_cast<pid_t>(std::atol(out.c_str()));
}

TEST_F(FakeBackendTest, CreatePingDestroyLeavesNothing) {
  FakeBackend backend(state_.string(), SBX_AGENT_PATH);
  ASSERT_TRUE(backend.Probe().ok());
  EXPECT_EQ(backend.Name(), "fake");
  auto inst = backend.Create(Spec("sbx_one"));
  ASSERT_TRUE(inst.ok()) << inst.status();
  const std::string socket = (*inst)->AgentSocketPath();
  EXPECT_TRUE(protocol::CallAgent(socket, Json{{"op", "ping"}}).ok());

  Json persisted = (*inst)->Persist();
  const pid_t agent_pid = persisted["pid"].get<pid_t>();
  EXPECT_EQ(persisted["socket"], socket);
  EXPECT_EQ(persisted["dir"], (state_ / "sandboxes" / "sbx_one").string());
  EXPECT_TRUE(Alive(agent_pid));

  const pid_t sleeper = StartBackground(socket, "s1");
  ASSERT_GT(sleeper, 0);
  EXPECT_TRUE(Alive(sleeper));

  ASSERT_TRUE((*inst)->Destroy().ok());
  EXPECT_TRUE(GoneWithin(agent_pid));
  EXPECT_TRUE(GoneWithin(sleeper)) << "session process survived Destroy";
  EXPECT_FALSE(fs::exists(state_ / "sandboxes" / "sbx_one"));
  EXPECT_TRUE((*inst)->Destroy().ok());  // idempotent
}

TEST_F(FakeBackendTest, AdoptFindsARunningAgentAndRejectsAGoneOne) {
  FakeBackend backend(state_.string(), SBX_AGENT_PATH);
  auto inst = backend.Create(Spec("sbx_two"));
  ASSERT_TRUE(inst.ok()) << inst.status();
  Json persisted = (*inst)->Persist();

  auto adopted = backend.Adopt("sbx_two", persisted);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ((*adopted)->AgentSocketPath(), (*inst)->AgentSocketPath());
  EXPECT_TRUE(protocol::CallAgent((*adopted)->AgentSocketPath(), Json{{"op", "ping"}}).ok());

  ASSERT_TRUE((*adopted)->Destroy().ok());
  EXPECT_TRUE(GoneWithin(persisted["pid"].get<pid_t>()));
  auto again = backend.Adopt("sbx_two", persisted);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
  EXPECT_TRUE((*inst)->Destroy().ok());

  // A pid that is alive but not our agent (this test process) is never adopted.
  Json forged = {{"pid", ::getpid()}, {"socket", "x"}, {"dir", (state_ / "sandboxes" / "sbx_x").string()}};
  fs::create_directories(state_ / "sandboxes" / "sbx_x");
  EXPECT_EQ(backend.Adopt("sbx_x", forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(backend.Adopt("../etc", forged).ok());
}

TEST_F(FakeBackendTest, SweepRemovesUnknownSandboxesOnly) {
  FakeBackend backend(state_.string(), SBX_AGENT_PATH);
  auto keep = backend.Create(Spec("sbx_keep"));
  auto drop = backend.Create(Spec("sbx_drop"));
  ASSERT_TRUE(keep.ok() && drop.ok());
  const pid_t drop_pid = (*drop)->Persist()["pid"].get<pid_t>();
  const pid_t sleeper = StartBackground((*drop)->AgentSocketPath(), "s");
  fs::create_directories(state_ / "sandboxes" / "sbx_stale");  // no agent at all

  ASSERT_TRUE(backend.Sweep({"sbx_keep"}).ok());
  EXPECT_TRUE(GoneWithin(drop_pid));
  EXPECT_TRUE(GoneWithin(sleeper));
  EXPECT_FALSE(fs::exists(state_ / "sandboxes" / "sbx_drop"));
  EXPECT_FALSE(fs::exists(state_ / "sandboxes" / "sbx_stale"));
  EXPECT_TRUE(protocol::CallAgent((*keep)->AgentSocketPath(), Json{{"op", "ping"}}).ok());
  EXPECT_TRUE((*drop)->Destroy().ok());
  EXPECT_TRUE((*keep)->Destroy().ok());
}

TEST_F(FakeBackendTest, RemoveCleansUpWithoutAnInstance) {
  FakeBackend backend(state_.string(), SBX_AGENT_PATH);
  auto inst = backend.Create(Spec("sbx_rm"));
  ASSERT_TRUE(inst.ok()) << inst.status();
  const pid_t pid = (*inst)->Persist()["pid"].get<pid_t>();
  const pid_t sleeper = StartBackground((*inst)->AgentSocketPath(), "s");
  ASSERT_TRUE(backend.Remove("sbx_rm").ok());
  EXPECT_TRUE(GoneWithin(pid));
  EXPECT_TRUE(GoneWithin(sleeper));
  EXPECT_FALSE(fs::exists(state_ / "sandboxes" / "sbx_rm"));
  EXPECT_TRUE(backend.Remove("sbx_rm").ok());  // idempotent
  EXPECT_FALSE(backend.Remove("../x").ok());
  EXPECT_TRUE((*inst)->Destroy().ok());
}

TEST_F(FakeBackendTest, FailedCreateLeavesNothing) {
  FakeBackend broken(state_.string(), "/nonexistent/sbx-agent");
  EXPECT_FALSE(broken.Probe().ok());
  auto inst = broken.Create(Spec("sbx_bad"));
  EXPECT_FALSE(inst.ok());
  EXPECT_FALSE(fs::exists(state_ / "sandboxes" / "sbx_bad"));

  // An agent that exits at once (bad arguments) is reported with its log.
  FakeBackend not_agent(state_.string(), "/bin/false");
  auto f = not_agent.Create(Spec("sbx_false"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(std::string(f.status().message()).find("agent exited"), std::string::npos)
      << f.status();
  EXPECT_FALSE(fs::exists(state_ / "sandboxes" / "sbx_false"));

  FakeBackend backend(state_.string(), SBX_AGENT_PATH);
  EXPECT_EQ(backend.Create(Spec("../escape")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto first = backend.Create(Spec("sbx_dup"));
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(backend.Create(Spec("sbx_dup")).ok());
  EXPECT_TRUE(fs::exists(state_ / "sandboxes" / "sbx_dup"));  // the first one is untouched
  EXPECT_TRUE((*first)->Destroy().ok());
}

}  // namespace
}  // namespace sbx::runtime
