// Root test: the real sbx-agent in a child memory cgroup with a small limit and the cgroup's
// real OOM counter as --oom-counter-fd. A session that allocates far past the limit is
// OOM-killed by the kernel, reported as oom_killed, its other processes are killed, and the
// agent lives on. No namespaces: only the memory cgroup (under this process's own, as
// feasibility §2 point 1 requires). Skips without root, fails instead when SBX_TESTS_MUST_RUN=1.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/ids.h"
#include "common/test_util.h"
#include "protocol/protocol.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/fsutil.h"

#ifndef SBX_AGENT_PATH
#define SBX_AGENT_PATH ""
#endif

namespace sbx::runtime::ns {
namespace {

using namespace std::chrono_literals;
using protocol::Json;

struct Exit {
  protocol::ExitEvent ev;
  std::string out;
};

absl::StatusOr<Exit> RunSession(const std::string& socket, const std::string& sid,
                                const std::vector<std::string>& argv) {
  auto conn = protocol::AgentConnection::Connect(socket, 60000);
  if (!conn.ok()) return conn.status();
  Json req = {{"op", "attach"},
              {"session_id", sid},
              {"after_event_id", 0},
              {"spec", {{"argv", argv}, {"cwd", "/"}, {"env", Json::object()}}}};
  if (auto r = conn->Call(req); !r.ok()) return r.status();
  Exit out;
  for (;;) {
    auto f = conn->ReadFrame();
    if (!f.ok()) return f.status();
    if (f->type == protocol::FrameType::kOutput) {
      auto o = protocol::DecodeOutput(f->payload);
      if (o.ok() && o->stream == protocol::Stream::kStdout) out.out += o->data;
    } else if (f->type == protocol::FrameType::kExit) {
      auto e = protocol::DecodeExit(f->payload);
      if (!e.ok()) return e.status();
      out.ev = *e;
      return out;
    }
  }
}

class AgentOomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      SBX_SKIP_OR_FAIL("needs root");
    }
    ASSERT_STRNE(SBX_AGENT_PATH, "");
    auto layout = DetectCgroupLayout(CgroupEnv{});
    ASSERT_TRUE(layout.ok()) << layout.status();
    const std::string name = NewId("sbx-agent-oom-test");
    if (auto it = layout->v1.find("memory"); it != layout->v1.end()) {
      cg_ = cgroup_internal::Join(cgroup_internal::Join(it->second.mount, it->second.own), name);
      limit_file_ = "memory.limit_in_bytes";
      counter_file_ = "memory.oom_control";
    } else if (layout->has_v2) {
      const std::string own = cgroup_internal::Join(layout->v2_mount, layout->v2_own);
      auto subtree = ReadFileToString(own + "/cgroup.subtree_control");
      if (!subtree.ok() || subtree->find("memory") == std::string::npos) {
        SBX_SKIP_OR_FAIL("no memory controller delegated to " << own);
      }
      cg_ = cgroup_internal::Join(own, name);
      limit_file_ = "memory.max";
      counter_file_ = "memory.events";
    } else {
      SBX_SKIP_OR_FAIL("no memory cgroup controller on this host");
    }
    ASSERT_EQ(::mkdir(cg_.c_str(), 0755), 0) << cg_ << ": " << std::strerror(errno);
    made_cg_ = true;
    ASSERT_TRUE(WriteStringToFile(cg_ + "/" + limit_file_, std::to_string(32 << 20)).ok());
    // No swap here, but where there is some it would let the session spill past the limit.
    if (::access((cg_ + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0) {
      ASSERT_TRUE(WriteStringToFile(cg_ + "/memory.memsw.limit_in_bytes", std::to_string(32 << 20)).ok());
    }
    if (::access((cg_ + "/memory.swap.max").c_str(), F_OK) == 0) {
      ASSERT_TRUE(WriteStringToFile(cg_ + "/memory.swap.max", "0").ok());
    }

    char tmpl[] = "/tmp/sbx-agent-oom-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/agent.sock";

    const std::string counter = cg_ + "/" + counter_file_;
    std::vector<std::string> args = {SBX_AGENT_PATH, "--listen", socket_, "--oom-counter-fd", "7"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"};
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string log = dir_ + "/agent.log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_addopen(&fa, 7, counter.c_str(), O_RDONLY, 0);
    int rc = posix_spawn(&agent_, SBX_AGENT_PATH, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ASSERT_EQ(rc, 0) << std::strerror(rc);
    // Into the limited cgroup before any session starts: sessions inherit it.
    ASSERT_TRUE(WriteStringToFile(cg_ + "/cgroup.procs", std::to_string(agent_)).ok());
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!protocol::CallAgent(socket_, Json{{"op", "ping"}}, 1000).ok()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "agent not ready";
      std::this_thread::sleep_for(10ms);
    }
  }

  void TearDown() override {
    if (agent_ > 0) {
      ::kill(agent_, SIGTERM);
      auto deadline = std::chrono::steady_clock::now() + 5s;
      int status = 0;
      while (::waitpid(agent_, &status, WNOHANG) != agent_) {
        if (std::chrono::steady_clock::now() >= deadline) {
          ::kill(agent_, SIGKILL);
          ::waitpid(agent_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
    }
    if (made_cg_) {
      // Anything left (there should be nothing) is killed, then the directory goes.
      auto deadline = std::chrono::steady_clock::now() + 5s;
      while (::rmdir(cg_.c_str()) != 0 && errno == EBUSY &&
             std::chrono::steady_clock::now() < deadline) {
        auto procs = ReadFileToString(cg_ + "/cgroup.procs");
        if (procs.ok()) {
          for (pid_t p : ParsePidList(*procs)) ::kill(p, SIGKILL);
        }
        std::this_thread::sleep_for(10ms);
      }
      EXPECT_FALSE(std::filesystem::exists(cg_)) << "cgroup left behind: " << cg_;
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::vector<pid_t> Procs() {
    auto procs = ReadFileToString(cg_ + "/cgroup.procs");
    return procs.ok() ? ParsePidList(*procs) : std::vector<pid_t>{};
  }

  std::string cg_, limit_file_, counter_file_, dir_, socket_;
  bool made_cg_ = false;
  pid_t agent_ = -1;
};

TEST_F(AgentOomTest, OomKilledSessionIsReportedAndContainedAndTheAgentSurvives) {
  // The session leader forks a helper into its group, then allocates 200 MiB under 32 MiB.
  auto r = RunSession(socket_, "oom",
                      {"python3", "-c",
                       "import subprocess\n"
                       "subprocess.Popen(['sleep', '300'])\n"
                       "b = bytearray(200 * 1024 * 1024)\n"
                       "print('allocated')\n"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ev.signal, "SIGKILL") << (r->ev.exit_code ? *r->ev.exit_code : -1) << " " << r->out;
  EXPECT_TRUE(r->ev.oom_killed);
  EXPECT_EQ(r->out.find("allocated"), std::string::npos);
  auto counter = ReadFileToString(cg_ + "/" + counter_file_);
  ASSERT_TRUE(counter.ok());
  EXPECT_NE(counter->find("oom_kill 1"), std::string::npos) << *counter;

  // The helper went with the session: only the agent is left in the cgroup.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (Procs() != std::vector<pid_t>{agent_} && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(Procs(), std::vector<pid_t>{agent_});

  // The agent survives and keeps serving: status says OOM, a new session is not flagged.
  auto st = protocol::CallAgent(socket_, Json{{"op", "status"}, {"session_id", "oom"}});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)["oom_killed"], true);
  auto next = RunSession(socket_, "next", {"sh", "-c", "echo fine"});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->ev.exit_code, 0);
  EXPECT_FALSE(next->ev.oom_killed);
  EXPECT_EQ(next->out, "fine\n");
  int status = 0;
  EXPECT_EQ(::waitpid(agent_, &status, WNOHANG), 0) << "the agent exited";
}

}  // namespace
}  // namespace sbx::runtime::ns
