// Runs the real sbx-agent binary as an ordinary child process (no namespaces) with --listen in
// a temporary directory and drives it through AgentConnection.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/base64.h"
#include "common/digest.h"
#include "common/test_util.h"
#include "protocol/limits.h"
#include "protocol/protocol.h"

#ifndef SBX_AGENT_PATH
#error "SBX_AGENT_PATH must point at the sbx-agent binary"
#endif

extern char** environ;

namespace sbx::agent {
namespace {

using namespace std::chrono_literals;
using protocol::AgentConnection;
using protocol::ExitEvent;
using protocol::Frame;
using protocol::FrameType;
using protocol::Json;
using protocol::ResyncEvent;
using protocol::Stream;

class AgentProcess {
 public:
  // `oom_counter`: a file the agent gets read-only as fd 7 with --oom-counter-fd 7, standing
  // in for the cgroup's memory.oom_control.
  explicit AgentProcess(std::vector<std::string> extra_args = {},
                        std::vector<std::string> extra_env = {}, std::string oom_counter = "") {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("sbx-agent-test." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    socket_ = (dir_ / "agent.sock").string();
    log_ = (dir_ / "agent.log").string();

    std::vector<std::string> args = {SBX_AGENT_PATH, "--listen", socket_};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    if (!oom_counter.empty()) {
      args.push_back("--oom-counter-fd");
      args.push_back(std::to_string(kOomFd));
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp",
                                    "LANG=C"};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (!oom_counter.empty()) {
      posix_spawn_file_actions_addopen(&fa, kOomFd, oom_counter.c_str(), O_RDONLY, 0);
    }
    int rc = posix_spawn(&pid_, SBX_AGENT_PATH, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn(" << SBX_AGENT_PATH << "): " << std::strerror(rc);
      pid_ = -1;
      return;
    }
    // Ready once a ping answers; short backoff, bounded.
    auto deadline = std::chrono::steady_clock::now() + 5s;
    auto backoff = 1ms;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = protocol::CallAgent(socket_, Json{{"op", "ping"}}, 1000);
      if (r.ok()) return;
      std::this_thread::sleep_for(backoff);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, 50ms);
    }
    ADD_FAILURE() << "agent did not answer a ping within 5 s; log:\n" << Log();
  }

  ~AgentProcess() {
    if (pid_ > 0) {
      // SIGTERM lets the agent kill its sessions' process groups; SIGKILL is the backstop.
      ::kill(pid_, SIGTERM);
      int status = 0;
      auto deadline = std::chrono::steady_clock::now() + 3s;
      bool reaped = false;
      while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          reaped = true;
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
      if (!reaped) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  static constexpr int kOomFd = 7;

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::string Log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  AgentConnection Connect() const {
    auto c = AgentConnection::Connect(socket_, 10000);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

 private:
  std::filesystem::path dir_;
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
};

Json Spec(std::vector<std::string> argv, Json extra = Json::object()) {
  Json spec = {{"argv", argv}, {"cwd", "/"}, {"env", Json::object()}};
  for (auto& [k, v] : extra.items()) spec[k] = v;
  return spec;
}

Json AttachReq(const std::string& sid, uint64_t after, std::optional<Json> spec = std::nullopt) {
  Json req = {{"op", "attach"}, {"session_id", sid}, {"after_event_id", after}};
  if (spec) req["spec"] = *spec;
  return req;
}

struct Chunk {
  Stream stream;
  uint64_t offset;  // stream offset reported by the agent
  size_t pos;       // where its bytes start in Collected::out / err
  size_t len;
};

struct Collected {
  std::string out, err;
  std::vector<uint64_t> ids;  // every event id in order, output and exit
  std::vector<Chunk> chunks;
  std::optional<ResyncEvent> resync;  // the first one
  int resyncs = 0;
  std::optional<ExitEvent> exit;
  bool closed_after_exit = false;
  std::string error;
};

// Reads the stream after an attach response until kExit and the agent's close. Checks on the
// way that ids increase by one and that offsets are contiguous per stream, except across a
// kResync, after which ids and offsets restart where the resync says.
// `after_frame` (given the number of frames read) lets a test be a slow reader.
Collected ReadStream(AgentConnection& c, size_t max_events = SIZE_MAX, bool from_start = true,
                     const std::function<void(size_t)>& after_frame = {}) {
  Collected r;
  size_t frames = 0;
  std::optional<uint64_t> next_offset[3];
  if (from_start) next_offset[1] = next_offset[2] = 0;
  std::optional<uint64_t> next_id;
  while (max_events-- > 0) {
    auto f = c.ReadFrame();
    if (!f.ok()) {
      r.error = std::string(f.status().message());
      return r;
    }
    if (after_frame) after_frame(++frames);
    switch (f->type) {
      case FrameType::kResync: {
        auto ev = protocol::DecodeResync(f->payload);
        EXPECT_TRUE(ev.ok());
        if (!r.resync) r.resync = *ev;
        ++r.resyncs;
        next_offset[1] = ev->stdout_offset;
        next_offset[2] = ev->stderr_offset;
        next_id = ev->oldest_available_id;
        break;
      }
      case FrameType::kOutput: {
        auto ev = protocol::DecodeOutput(f->payload);
        EXPECT_TRUE(ev.ok());
        if (next_id) {
          EXPECT_EQ(ev->event_id, *next_id);
        }
        next_id = ev->event_id + 1;
        r.ids.push_back(ev->event_id);
        const int s = static_cast<int>(ev->stream);
        if (next_offset[s]) {
          EXPECT_EQ(ev->offset, *next_offset[s]) << "event " << ev->event_id;
        }
        next_offset[s] = ev->offset + ev->data.size();
        std::string& dst = ev->stream == Stream::kStdout ? r.out : r.err;
        r.chunks.push_back({ev->stream, ev->offset, dst.size(), ev->data.size()});
        dst += ev->data;
        break;
      }
      case FrameType::kExit: {
        auto ev = protocol::DecodeExit(f->payload);
        EXPECT_TRUE(ev.ok());
        if (next_id) {
          EXPECT_EQ(ev->event_id, *next_id);
        }
        r.ids.push_back(ev->event_id);
        r.exit = *ev;
        auto eof = c.ReadFrame();
        r.closed_after_exit =
            !eof.ok() && eof.status().code() == absl::StatusCode::kUnavailable;
        return r;
      }
      default:
        ADD_FAILURE() << "unexpected frame type " << static_cast<int>(f->type);
        return r;
    }
  }
  return r;
}

// Every stdout chunk holds the bytes of `file` at its offset, and the last one ends the file.
void ExpectStdoutMatches(const Collected& r, const std::string& file) {
  uint64_t end = 0;
  for (const Chunk& ch : r.chunks) {
    if (ch.stream != Stream::kStdout) continue;
    ASSERT_LE(ch.offset + ch.len, file.size());
    ASSERT_TRUE(std::memcmp(r.out.data() + ch.pos, file.data() + ch.offset, ch.len) == 0)
        << "chunk at offset " << ch.offset;
    end = ch.offset + ch.len;
  }
  EXPECT_EQ(end, file.size());
}

// Starts (or re-attaches to) a session and reads it to the end.
Collected RunSession(const AgentProcess& agent, const std::string& sid, const Json& spec,
                     uint64_t after = 0) {
  AgentConnection c = agent.Connect();
  auto resp = c.Call(AttachReq(sid, after, spec));
  EXPECT_TRUE(resp.ok()) << resp.status();
  if (!resp.ok()) return {};
  return ReadStream(c);
}

Json Status(const AgentProcess& agent, const std::string& sid) {
  auto r = protocol::CallAgent(agent.socket(), Json{{"op", "status"}, {"session_id", sid}});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : Json();
}

std::string WriteFile(const std::filesystem::path& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  return p.string();
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&s[i], &v, 8);
  }
  return s;
}

TEST(Agent, EchoOutputAndExitZero) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  auto resp = c.Call(AttachReq("s1", 0, Spec({"echo", "hello", "world"})));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ((*resp)["started"], true);
  EXPECT_GT((*resp)["pid"].get<int>(), 0);
  Collected r = ReadStream(c);
  EXPECT_EQ(r.out, "hello world\n");
  EXPECT_EQ(r.err, "");
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 0);
  EXPECT_FALSE(r.exit->signal.has_value());
  EXPECT_EQ(r.ids.front(), 1u);
  EXPECT_EQ(r.exit->event_id, r.ids.back());
  EXPECT_TRUE(r.closed_after_exit);

  Json st = Status(agent, "s1");
  EXPECT_EQ(st["state"], "exited");
  EXPECT_EQ(st["exit_code"], 0);
  EXPECT_TRUE(st["signal"].is_null());
  EXPECT_EQ(st["pid"], (*resp)["pid"]);
  EXPECT_TRUE(st["started_at"].is_string());
  EXPECT_TRUE(st["exited_at"].is_string());
  EXPECT_EQ(st["exited_at"].get<std::string>().back(), 'Z');
}

// agent.log is sbxd's JSON format: one object per line, the sandbox on each, the session on a
// session's lines, and of the command only argv[0] (the rest may hold the caller's secrets, as
// the environment does).
TEST(Agent, LogLinesAreJsonWithSandboxAndSession) {
  AgentProcess agent({"--sandbox-id", "sbx_logtest"});
  Json spec = Spec({"sh", "-c", "echo \"$SECRET\"", "argv-secret-1"},
                   Json{{"env", {{"SECRET", "env-secret-2"}}}});
  Collected r = RunSession(agent, "ses_log1", spec);
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.out, "env-secret-2\n");
  std::vector<Json> lines;
  std::istringstream in(agent.Log());
  for (std::string line; std::getline(in, line);) {
    auto j = Json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    lines.push_back(j);
  }
  int session_lines = 0;
  for (const Json& j : lines) {
    EXPECT_EQ(j["sandbox"], "sbx_logtest") << j.dump();
    EXPECT_TRUE(j["ts"].is_string() && j["level"].is_string() && j["msg"].is_string()) << j.dump();
    const std::string msg = j["msg"];
    if (msg.rfind("session ses_log1 ", 0) == 0) {
      ++session_lines;
      EXPECT_EQ(j["session"], "ses_log1") << j.dump();
    }
  }
  EXPECT_EQ(session_lines, 2) << agent.Log();  // started, exited
  EXPECT_EQ(agent.Log().find("secret"), std::string::npos) << agent.Log();
}

TEST(Agent, NonZeroExitAndStderr) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"sh", "-c", "echo out; echo err >&2; exit 3"}));
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 3);
}

TEST(Agent, KilledBySignal) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"sh", "-c", "kill -9 $$"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_FALSE(r.exit->exit_code.has_value());
  EXPECT_EQ(r.exit->signal, "SIGKILL");
  Json st = Status(agent, "s");
  EXPECT_EQ(st["signal"], "SIGKILL");
  EXPECT_TRUE(st["exit_code"].is_null());
}

// --- OOM attribution (oom.h): a regular file stands in for the cgroup's OOM counter. ---

class OomCounterFile {
 public:
  OomCounterFile() {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("sbx-agent-oom." + std::to_string(::getpid()) + "." + std::to_string(counter++)))
                .string();
    Set("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  }
  ~OomCounterFile() { std::filesystem::remove(path_); }
  // Rewritten in place: the agent keeps the inode open and preads it.
  void Set(const std::string& text) {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f << text;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// 'R', 'S', 'Z', ... of a process, or 0 once it is gone (reaped).
char ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? 0 : line[close + 2];
}

// An "eventually" bound, not a claim about speed: generous enough for a loaded 2-core CI host,
// and it returns as soon as the process is gone.
constexpr auto kGoneLimit = 30s;

bool GoneWithin(pid_t pid, std::chrono::milliseconds limit = kGoneLimit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    char st = ProcState(pid);
    if (st == 0 || st == 'Z') return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
}

pid_t ReadPidFile(const std::filesystem::path& p) {
  auto deadline = std::chrono::steady_clock::now() + kGoneLimit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(p);
    pid_t pid = 0;
    if (f >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(5ms);
  }
  ADD_FAILURE() << "no pid in " << p;
  return -1;
}

struct OomRun {
  std::optional<ExitEvent> exit;
  pid_t background = -1;
  std::string error;
};

// A session that starts a background child in its process group, waits for `go`, then
// either SIGKILLs itself or runs `finish`. `between` runs after the session has started and
// before `go` is created (where the test bumps the counter).
OomRun RunOomSession(const AgentProcess& agent, const std::string& sid,
                     const std::function<void()>& between, const std::string& finish = "kill -9 $$") {
  const std::filesystem::path dir = agent.dir() / sid;
  std::filesystem::create_directories(dir);
  const std::string script =
      "sleep 300 >/dev/null 2>&1 & echo $! > \"$0/bg.pid\"\n"
      "while [ ! -e \"$0/go\" ]; do sleep 0.01; done\n" + finish + "\n";
  AgentConnection c = agent.Connect();
  OomRun run;
  auto resp = c.Call(AttachReq(sid, 0, Spec({"sh", "-c", script, dir.string()})));
  EXPECT_TRUE(resp.ok()) << resp.status();
  if (!resp.ok()) return run;
  run.background = ReadPidFile(dir / "bg.pid");
  between();
  WriteFile(dir / "go", "");
  Collected col = ReadStream(c);
  run.exit = col.exit;
  run.error = col.error;
  return run;
}

TEST(AgentOom, SigkillAfterTheCounterGrewIsOomAndKillsTheSession) {
  OomCounterFile counter;
  AgentProcess agent({}, {}, counter.path());
  OomRun r = RunOomSession(agent, "s", [&] {
    counter.Set("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
  });
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->signal, "SIGKILL");
  EXPECT_TRUE(r.exit->oom_killed);
  // The rest of the session's process group goes with it.
  ASSERT_GT(r.background, 0);
  EXPECT_TRUE(GoneWithin(r.background)) << "background child " << r.background << " survived";
  Json st = Status(agent, "s");
  EXPECT_EQ(st["oom_killed"], true);
  EXPECT_EQ(st["signal"], "SIGKILL");
  // The agent lives on and a later session starts with the counter as it is now.
  OomRun next = RunOomSession(agent, "t", [] {});
  ASSERT_TRUE(next.exit.has_value()) << next.error;
  EXPECT_FALSE(next.exit->oom_killed);
  EXPECT_NE(agent.Log().find("OOM-killed"), std::string::npos) << agent.Log();
}

TEST(AgentOom, SigkillWithoutGrowthIsNotOomAndLeavesTheGroupAlone) {
  OomCounterFile counter;
  AgentProcess agent({}, {}, counter.path());
  OomRun r = RunOomSession(agent, "s", [] {});
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->signal, "SIGKILL");
  EXPECT_FALSE(r.exit->oom_killed);
  ASSERT_GT(r.background, 0);
  char st = ProcState(r.background);
  EXPECT_TRUE(st != 0 && st != 'Z') << "state " << st;
  EXPECT_EQ(Status(agent, "s")["oom_killed"], false);
}

TEST(AgentOom, OnlyADeathBySigkillCounts) {
  OomCounterFile counter;
  AgentProcess agent({}, {}, counter.path());
  OomRun r = RunOomSession(agent, "s", [&] { counter.Set("oom_kill 5\n"); }, "exit 3");
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 3);
  EXPECT_FALSE(r.exit->oom_killed);
  OomRun t = RunOomSession(agent, "t", [&] { counter.Set("oom_kill 6\n"); }, "kill -15 $$");
  ASSERT_TRUE(t.exit.has_value()) << t.error;
  EXPECT_EQ(t.exit->signal, "SIGTERM");
  EXPECT_FALSE(t.exit->oom_killed);
}

TEST(AgentOom, MalformedCounterIsNeverOom) {
  OomCounterFile counter;
  counter.Set("garbage\n");
  AgentProcess agent({}, {}, counter.path());
  OomRun r = RunOomSession(agent, "s", [&] { counter.Set("oom_kill lots\n\x01\x02"); });
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->signal, "SIGKILL");
  EXPECT_FALSE(r.exit->oom_killed);
  OomRun t = RunOomSession(agent, "t", [&] { counter.Set(""); });
  ASSERT_TRUE(t.exit.has_value()) << t.error;
  EXPECT_FALSE(t.exit->oom_killed);
  EXPECT_TRUE(protocol::CallAgent(agent.socket(), Json{{"op", "ping"}}).ok());
}

TEST(AgentOom, WithoutTheFlagOomDetectionIsOff) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"sh", "-c", "kill -9 $$"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_FALSE(r.exit->oom_killed);
}

TEST(AgentOom, AnUnreadableCounterFdFailsStartUp) {
  std::vector<std::string> args = {SBX_AGENT_PATH, "--listen", "/nonexistent/agent.sock",
                                   "--oom-counter-fd", "9"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addclose(&fa, 9);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, SBX_AGENT_PATH, &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

TEST(Agent, SessionProcessesAreTheOomKillersFirstChoice) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"cat", "/proc/self/oom_score_adj"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.out, "500\n");
}

TEST(Agent, SignalOpReachesTheProcessGroup) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  // The shell waits on a child in the same group: both must get the signal.
  ASSERT_TRUE(c.Call(AttachReq("s", 0, Spec({"sh", "-c", "sleep 30; echo survived"}))).ok());
  EXPECT_EQ(Status(agent, "s")["state"], "running");
  auto r = protocol::CallAgent(agent.socket(),
                               Json{{"op", "signal"}, {"session_id", "s"}, {"signal", 15}});
  ASSERT_TRUE(r.ok()) << r.status();
  Collected col = ReadStream(c);
  ASSERT_TRUE(col.exit.has_value()) << col.error;
  EXPECT_EQ(col.exit->signal, "SIGTERM");
  EXPECT_EQ(col.out, "");

  auto again = protocol::CallAgent(agent.socket(),
                                   Json{{"op", "signal"}, {"session_id", "s"}, {"signal", 9}});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  auto unknown = protocol::CallAgent(
      agent.socket(), Json{{"op", "signal"}, {"session_id", "nope"}, {"signal", 9}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  auto bad = protocol::CallAgent(agent.socket(),
                                 Json{{"op", "signal"}, {"session_id", "s"}, {"signal", 0}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Agent, BinaryOutputIsByteExact) {
  AgentProcess agent;
  std::string all;
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  }
  std::string path = WriteFile(agent.dir() / "bytes.bin", all);
  Collected r = RunSession(agent, "s", Spec({"sh", "-c", "cat \"$0\"; cat \"$0\" >&2", path}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.out, all);
  EXPECT_EQ(r.err, all);
}

TEST(Agent, FiftyMegabytesOfStdoutAreByteExactWithBackPressure) {
  // A 1 MiB budget against 50 MiB: the agent must stall the writer instead of losing data.
  AgentProcess agent({"--buffer-bytes", "1048576"});
  const size_t kSize = 50u << 20;
  std::string data = RandomBytes(kSize, 42);
  const std::string want = Sha256Hex(data);
  std::string path = WriteFile(agent.dir() / "big.bin", data);
  data.clear();
  data.shrink_to_fit();

  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("big", 0, Spec({"cat", path}))).ok());
  // Stay away for a while: the process must block, not lose output.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(Status(agent, "big")["state"], "running");
  Collected r = ReadStream(c);
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 0);
  EXPECT_EQ(r.resyncs, 0);
  EXPECT_EQ(r.out.size(), kSize);
  EXPECT_EQ(Sha256Hex(r.out), want);

  // Memory stayed bounded by the budget, not by the output volume. (ASan's quarantine keeps
  // freed memory resident, so the peak means nothing there.)
#ifndef __SANITIZE_ADDRESS__
  std::ifstream st("/proc/" + std::to_string(agent.pid()) + "/status");
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      long kb = std::stol(line.substr(6));
      EXPECT_LT(kb, 32 * 1024) << line;
    }
  }
#endif
}

TEST(Agent, ReattachAfterDisconnectWithAndWithoutAfterEventId) {
  AgentProcess agent;
  const Json spec = Spec({"sh", "-c", "echo a; sleep 0.4; echo b >&2; sleep 0.2; echo c"});
  uint64_t first_id = 0;
  {
    AgentConnection c = agent.Connect();
    auto resp = c.Call(AttachReq("s", 0, spec));
    ASSERT_TRUE(resp.ok());
    Collected part = ReadStream(c, 1);
    ASSERT_EQ(part.out, "a\n");
    first_id = part.ids.at(0);
  }  // disconnect mid-run: the process must keep running
  EXPECT_EQ(Status(agent, "s")["state"], "running");

  // Re-attach live, resuming after what was seen. Spec is ignored: no restart.
  {
    AgentConnection c = agent.Connect();
    auto resp = c.Call(AttachReq("s", first_id, spec));
    ASSERT_TRUE(resp.ok());
    EXPECT_EQ((*resp)["started"], false);
    Collected r = ReadStream(c, SIZE_MAX, /*from_start=*/false);
    EXPECT_EQ(r.out, "c\n");
    EXPECT_EQ(r.err, "b\n");
    ASSERT_TRUE(r.exit.has_value()) << r.error;
    EXPECT_EQ(r.ids.front(), first_id + 1);
    EXPECT_EQ(r.exit->exit_code, 0);
  }
  // Attach after exit, from the start: everything is replayed, then the exit event.
  {
    AgentConnection c = agent.Connect();
    auto resp = c.Call(AttachReq("s", 0));  // no spec needed any more
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ((*resp)["started"], false);
    Collected r = ReadStream(c);
    EXPECT_EQ(r.out, "a\nc\n");
    EXPECT_EQ(r.err, "b\n");
    EXPECT_EQ(r.ids, (std::vector<uint64_t>{1, 2, 3, 4}));
    ASSERT_TRUE(r.exit.has_value());
    EXPECT_TRUE(r.closed_after_exit);
  }
  // Attach after exit having seen everything but the exit event.
  {
    AgentConnection c = agent.Connect();
    ASSERT_TRUE(c.Call(AttachReq("s", 3)).ok());
    Collected r = ReadStream(c, SIZE_MAX, false);
    EXPECT_EQ(r.ids, (std::vector<uint64_t>{4}));
    EXPECT_TRUE(r.exit.has_value());
  }
}

TEST(Agent, ResyncWhenAfterEventIdIsOlderThanRetained) {
  AgentProcess agent({"--buffer-bytes", "4096"});
  // ~109 KB of stdout in many events; a reader consumes it all so it may be evicted.
  Collected full = RunSession(agent, "s", Spec({"sh", "-c", "seq 1 20000; echo done >&2"}));
  ASSERT_TRUE(full.exit.has_value()) << full.error;
  ASSERT_GT(full.out.size(), 100000u);
  ASSERT_EQ(full.err, "done\n");

  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("s", 0)).ok());
  Collected r = ReadStream(c);
  ASSERT_TRUE(r.resync.has_value());
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_GT(r.resync->oldest_available_id, 1u);
  EXPECT_GT(r.resync->stdout_offset, 0u);
  EXPECT_EQ(r.out, full.out.substr(r.resync->stdout_offset));
  EXPECT_EQ(r.err, full.err.substr(r.resync->stderr_offset));
  EXPECT_LE(r.out.size(), 4096u + 65536u);
  EXPECT_EQ(r.exit->event_id, full.exit->event_id);

  // Exactly at the oldest retained event: no resync.
  AgentConnection c2 = agent.Connect();
  ASSERT_TRUE(c2.Call(AttachReq("s", r.resync->oldest_available_id - 1)).ok());
  Collected r2 = ReadStream(c2, SIZE_MAX, false);
  EXPECT_FALSE(r2.resync.has_value());
  EXPECT_EQ(r2.out, r.out);
}

TEST(Agent, FinishedSessionsShareABoundedRetention) {
  // 64 KiB per stream: finished sessions may keep 128 KiB in total.
  AgentProcess agent({"--buffer-bytes", "65536"});
  // 40000 bytes each: below the per-stream budget, so each session keeps all of it until the
  // total of finished sessions (5 x 40000) goes over 128 KiB and the oldest two are dropped.
  std::string path = WriteFile(agent.dir() / "40k", std::string(40000, 'x'));
  const Json spec = Spec({"sh", "-c", "cat \"$0\"; exit 5", path});
  for (int i = 0; i < 5; ++i) {
    Collected r = RunSession(agent, "s" + std::to_string(i), spec);
    ASSERT_TRUE(r.exit.has_value()) << r.error;
  }
  // The oldest lost its output but not its exit, and is not run again.
  AgentConnection c = agent.Connect();
  auto resp = c.Call(AttachReq("s0", 0, spec));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ((*resp)["started"], false);
  Collected old = ReadStream(c);
  ASSERT_TRUE(old.resync.has_value());
  EXPECT_EQ(old.resync->oldest_available_id, old.exit->event_id);
  EXPECT_EQ(old.out.size(), 0u);
  EXPECT_EQ(old.exit->exit_code, 5);
  EXPECT_EQ(Status(agent, "s0")["exit_code"], 5);
  // The newer ones still replay in full.
  for (const char* sid : {"s1", "s2", "s4"}) {
    AgentConnection ci = agent.Connect();
    ASSERT_TRUE(ci.Call(AttachReq(sid, 0)).ok());
    Collected r = ReadStream(ci);
    EXPECT_TRUE(r.exit.has_value());
    EXPECT_EQ(r.out.size(), std::string(sid) == "s1" ? 0u : 40000u) << sid;
  }
}

TEST(Agent, ExecOfMissingBinary) {
  AgentProcess agent;
  Collected r = RunSession(agent, "a", Spec({"/nonexistent/bin/tool", "x"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 127);
  EXPECT_EQ(r.err, "sbx-agent: exec /nonexistent/bin/tool: No such file or directory\n");

  Collected p = RunSession(agent, "b", Spec({"no-such-command-sbx"}));
  ASSERT_TRUE(p.exit.has_value()) << p.error;
  EXPECT_EQ(p.exit->exit_code, 127);
  EXPECT_EQ(p.err, "sbx-agent: exec no-such-command-sbx: No such file or directory\n");

  Collected d = RunSession(agent, "c", Spec({"true"}, {{"cwd", "/nonexistent-dir"}}));
  ASSERT_TRUE(d.exit.has_value()) << d.error;
  EXPECT_EQ(d.exit->exit_code, 126);
  EXPECT_EQ(d.err, "sbx-agent: chdir /nonexistent-dir: No such file or directory\n");

  std::string not_exec = WriteFile(agent.dir() / "script", "#!/bin/sh\necho hi\n");
  Collected e = RunSession(agent, "d", Spec({not_exec}));
  ASSERT_TRUE(e.exit.has_value()) << e.error;
  EXPECT_EQ(e.exit->exit_code, 127);
  EXPECT_NE(e.err.find("Permission denied"), std::string::npos) << e.err;
}

TEST(Agent, EnvironmentCwdAndSpecValidation) {
  AgentProcess agent({}, {"FOO=from-agent", "SBX_AGENT_SECRET=hidden"});
  Collected r = RunSession(
      agent, "s",
      Spec({"sh", "-c", "echo \"$FOO|$BAR|${SBX_AGENT_SECRET-unset}|$(pwd)\""},
           {{"env", {{"BAR", "from-spec"}}}, {"cwd", "/tmp"}}));
  EXPECT_EQ(r.out, "from-agent|from-spec|unset|/tmp\n");

  Collected o = RunSession(agent, "o", Spec({"sh", "-c", "echo $FOO"},
                                            {{"env", {{"FOO", "overridden"}}}}));
  EXPECT_EQ(o.out, "overridden\n");

  // Only fds 0-2 reach the process.
  Collected fds = RunSession(agent, "fds", Spec({"sh", "-c", "ls /proc/self/fd | wc -l"}));
  EXPECT_EQ(fds.out, "4\n");  // 0, 1, 2 and ls's own directory fd

  for (const Json& bad :
       {Json{{"argv", Json::array()}}, Json{{"argv", {1, 2}}}, Json{{"argv", {"x"}}, {"env", {{"A", 1}}}},
        Json{{"argv", {"x"}}, {"cwd", 5}}, Json{{"argv", {""}}}, Json("string"),
        Json{{"argv", {"x"}}, {"user", "no-such-user-sbx"}}}) {
    auto resp = protocol::CallAgent(agent.socket(), AttachReq("bad", 0, bad));
    EXPECT_FALSE(resp.ok()) << bad.dump();
    EXPECT_EQ(Status(agent, "bad")["state"], "unknown") << bad.dump();
  }
  auto nospec = protocol::CallAgent(agent.socket(), AttachReq("never-started", 0));
  EXPECT_EQ(nospec.status().code(), absl::StatusCode::kNotFound) << nospec.status();
}

TEST(Agent, UserSwitch) {
  if (::geteuid() != 0) SBX_SKIP_OR_FAIL("needs root to switch users");
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"id", "-u"}, {{"user", "nobody"}}));
  EXPECT_EQ(r.out, "65534\n");
  Collected n = RunSession(agent, "n", Spec({"id", "-u"}, {{"user", "4321"}}));
  EXPECT_EQ(n.out, "4321\n");
}

TEST(Agent, NoUserSwitchOptionIgnoresUser) {
  AgentProcess agent({"--no-user-switch"});
  Collected r = RunSession(agent, "s", Spec({"id", "-u"}, {{"user", "no-such-user-sbx"}}));
  EXPECT_EQ(r.out, std::to_string(::geteuid()) + "\n");
}

TEST(Agent, TwoSessionsConcurrently) {
  AgentProcess agent;
  const char* script =
      "i=0; while [ $i -lt 40 ]; do echo \"$0 $i\"; i=$((i+1)); sleep 0.005; done";
  AgentConnection a = agent.Connect();
  AgentConnection b = agent.Connect();
  ASSERT_TRUE(a.Call(AttachReq("A", 0, Spec({"sh", "-c", script, "A"}))).ok());
  ASSERT_TRUE(b.Call(AttachReq("B", 0, Spec({"sh", "-c", script, "B"}))).ok());
  Collected ra, rb;
  std::thread ta([&] { ra = ReadStream(a); });
  std::thread tb([&] { rb = ReadStream(b); });
  ta.join();
  tb.join();
  std::string want_a, want_b;
  for (int i = 0; i < 40; ++i) {
    want_a += "A " + std::to_string(i) + "\n";
    want_b += "B " + std::to_string(i) + "\n";
  }
  EXPECT_EQ(ra.out, want_a);
  EXPECT_EQ(rb.out, want_b);
  ASSERT_TRUE(ra.exit && rb.exit);
  EXPECT_EQ(ra.exit->exit_code, 0);
  EXPECT_EQ(rb.exit->exit_code, 0);
  EXPECT_EQ(ra.ids.front(), 1u);  // ids are per session
  EXPECT_EQ(rb.ids.front(), 1u);
}

TEST(Agent, TwoConnectionsOnOneSessionEachGetEverything) {
  AgentProcess agent;
  AgentConnection a = agent.Connect();
  AgentConnection b = agent.Connect();
  ASSERT_TRUE(a.Call(AttachReq("s", 0, Spec({"sh", "-c", "sleep 0.2; seq 1 3000"}))).ok());
  ASSERT_TRUE(b.Call(AttachReq("s", 0)).ok());
  Collected ra, rb;
  std::thread ta([&] { ra = ReadStream(a); });
  std::thread tb([&] { rb = ReadStream(b); });
  ta.join();
  tb.join();
  EXPECT_EQ(ra.out, rb.out);
  EXPECT_EQ(ra.ids, rb.ids);
  EXPECT_TRUE(ra.exit.has_value());
}

// Large events leave the agent from the log's own buffer (Connection::spliced), shared by
// every connection that has them in flight. A reader that takes its frames in small gulps has
// partial sends in the middle of such buffers while the other reader's delivery evicts their
// events: both must still get every byte they are told about, where the offsets say.
TEST(Agent, TwoReadersOfLargeEventsEachGetExactBytes) {
  AgentProcess agent({"--buffer-bytes", "1048576"});
  const std::string file = RandomBytes(6u << 20, 11);
  std::string path = WriteFile(agent.dir() / "big.bin", file);
  AgentConnection a = agent.Connect();
  AgentConnection b = agent.Connect();
  ASSERT_TRUE(a.Call(AttachReq("s", 0, Spec({"sh", "-c", "sleep 0.1; cat \"$0\"", path}))).ok());
  ASSERT_TRUE(b.Call(AttachReq("s", 0)).ok());
  Collected ra, rb;
  std::thread ta([&] { ra = ReadStream(a); });
  std::thread tb([&] {
    // Slower: a pause every few frames keeps the agent's sends to it partial.
    rb = ReadStream(b, SIZE_MAX, true, [](size_t frames) {
      if (frames % 8 == 0) std::this_thread::sleep_for(1ms);
    });
  });
  ta.join();
  tb.join();
  ASSERT_TRUE(ra.exit.has_value()) << ra.error;
  ASSERT_TRUE(rb.exit.has_value()) << rb.error;
  ExpectStdoutMatches(ra, file);
  ExpectStdoutMatches(rb, file);
}

TEST(Agent, OrphansAreReaped) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"sh", "-c", "sleep 0.5 & echo $!"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  const std::string orphan = r.out.substr(0, r.out.find('\n'));
  ASSERT_FALSE(orphan.empty());
  // The orphan was reparented to the agent (a child subreaper when not PID 1) ...
  {
    std::ifstream stat("/proc/" + orphan + "/stat");
    std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    if (!s.empty()) {
      std::istringstream fields(s.substr(s.rfind(')') + 2));
      char state;
      pid_t ppid;
      fields >> state >> ppid;
      EXPECT_EQ(ppid, agent.pid());
    }
  }
  // ... and once it exits it does not stay a zombie.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::filesystem::exists("/proc/" + orphan) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(std::filesystem::exists("/proc/" + orphan)) << "orphan " << orphan << " not reaped";
}

// The exit event must not wait for the output pipes to reach EOF: a background child that
// inherited them may hold them for much longer. Proven by order, not time: the exit arrives
// while the child that holds the pipe is still alive (it would live for 120 s; a wait for
// EOF would end the read at the connection's 10 s read timeout, without an exit).
TEST(Agent, BackgroundChildHoldingThePipeDoesNotDelayExit) {
  AgentProcess agent;
  const std::filesystem::path pid_file = agent.dir() / "holder.pid";
  Collected r = RunSession(
      agent, "s",
      Spec({"sh", "-c", "echo before; sleep 120 & echo $! > \"$0\"; exit 4", pid_file.string()}));
  pid_t holder = 0;
  std::ifstream(pid_file) >> holder;
  struct Killer {  // the holder never outlives the test, whatever fails
    pid_t pid;
    ~Killer() {
      if (pid > 0) ::kill(pid, SIGKILL);
    }
  } killer{holder};
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 4);
  EXPECT_EQ(r.out, "before\n");
  ASSERT_GT(holder, 0);
  const char state = ProcState(holder);
  EXPECT_TRUE(state != 0 && state != 'Z')
      << "the pipe holder " << holder << " had ended before the exit arrived (state " << state << ")";
}

TEST(Agent, ProtocolErrorsOnlyCloseThatConnection) {
  AgentProcess agent;
  auto unknown = protocol::CallAgent(agent.socket(), Json{{"op", "dance"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(unknown.status().message()).find("agent: invalid_argument: "),
            std::string::npos);
  auto noop = protocol::CallAgent(agent.socket(), Json{{"no", "op"}});
  EXPECT_EQ(noop.status().code(), absl::StatusCode::kInvalidArgument);

  auto raw = [&](const std::string& bytes) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, agent.socket().c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    char buf[256];
    std::string got;
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
    EXPECT_EQ(n, 0) << "the agent should close the connection";
    EXPECT_EQ(got, "");
    ::close(fd);
  };
  raw(std::string("\0\0\0\0\x07\x01\0\0", 8));                          // bad version
  raw(std::string("\0\0\0\0\x01\x09\0\0", 8));                          // bad type
  raw(std::string("\0\0\0\0\x01\x01\0\x01", 8));                        // reserved != 0
  raw(std::string("\x7f\0\0\0\x01\x01\0\0", 8));                        // oversize
  raw(protocol::EncodeFrame(FrameType::kRequest, R"({"op":"ping"})"));  // no hello
  raw(protocol::EncodeFrame(FrameType::kHello, "{}") +
      protocol::EncodeFrame(FrameType::kOutput, "x"));                  // not a request

  // Invalid JSON in a well-formed request gets an error response.
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, agent.socket().c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string bytes = protocol::EncodeFrame(FrameType::kHello, "{}") +
                        protocol::EncodeFrame(FrameType::kRequest, "{not json");
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    protocol::FrameDecoder d;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) d.Feed(std::string_view(buf, static_cast<size_t>(n)));
    ::close(fd);
    auto hello = d.Next();
    ASSERT_TRUE(hello.ok() && hello->has_value());
    auto resp = d.Next();
    ASSERT_TRUE(resp.ok() && resp->has_value());
    Json j = Json::parse((*resp)->payload);
    EXPECT_EQ(j["ok"], false);
    EXPECT_EQ(j["error"]["code"], "invalid_argument");
  }

  // A client that connects and vanishes mid-frame.
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, agent.socket().c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    (void)!::send(fd, "\0\0\0\x10\x01", 5, MSG_NOSIGNAL);
    ::close(fd);
  }

  auto ping = protocol::CallAgent(agent.socket(), Json{{"op", "ping"}});
  EXPECT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(Status(agent, "nothing")["state"], "unknown");
}

TEST(Agent, SlowReaderDoesNotBlockOthers) {
  AgentProcess agent({"--buffer-bytes", "1048576"});
  const std::string file = RandomBytes(8u << 20, 7);
  std::string path = WriteFile(agent.dir() / "big.bin", file);
  // A connection that does not read while the session produces 8 MiB.
  AgentConnection slow = agent.Connect();
  ASSERT_TRUE(slow.Call(AttachReq("big", 0, Spec({"cat", path}))).ok());
  // Meanwhile other sessions and requests are served. Proven by order, not time: the quick
  // session runs to its exit while the big one is still held up by the reader that does not
  // read (8 MiB cannot fit the 1 MiB buffer and the socket, so `cat` cannot have finished).
  // An agent blocked on the slow reader would answer nothing and the quick session's read
  // would end at the connection's 10 s read timeout, without an exit.
  Collected r = RunSession(agent, "quick", Spec({"echo", "quick"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.out, "quick\n");
  EXPECT_EQ(Status(agent, "big")["state"], "running") << "the quick session was not served "
                                                         "while the big one was still streaming";
  // A second reader of the big session drives it to the end. Events only the slow reader
  // has not had may be evicted meanwhile (retention follows the fastest reader): both
  // streams must stay consistent, with a kResync wherever a gap is.
  Collected fast = RunSession(agent, "big", Json(), 0);
  ASSERT_TRUE(fast.exit.has_value()) << fast.error;
  ExpectStdoutMatches(fast, file);
  Collected late = ReadStream(slow);
  ASSERT_TRUE(late.exit.has_value()) << late.error;
  ExpectStdoutMatches(late, file);
  EXPECT_GT(late.resyncs, 0);
}

// ---- Interactive sessions: stdin, timeout, pty, resize, process list ----------------------

absl::StatusOr<Json> Call(const AgentProcess& agent, const Json& req) {
  return protocol::CallAgent(agent.socket(), req);
}

Json StdinReq(const std::string& sid, std::string_view data) {
  return Json{{"op", "stdin"}, {"session_id", sid}, {"data_b64", Base64Encode(data)}};
}

// Reads output frames until the stdout collected so far contains `needle`; false at the exit
// event, on an error, or when the agent sends nothing for the connection's read timeout.
bool ReadUntil(AgentConnection& c, std::string& acc, std::string_view needle,
               std::optional<ExitEvent>* exit = nullptr) {
  while (acc.find(needle) == std::string::npos) {
    auto f = c.ReadFrame();
    if (!f.ok()) return false;
    if (f->type == FrameType::kExit) {
      if (exit) *exit = *protocol::DecodeExit(f->payload);
      return false;
    }
    if (f->type != FrameType::kOutput) continue;
    auto ev = protocol::DecodeOutput(f->payload);
    if (!ev.ok()) return false;
    acc += ev->data;
  }
  return true;
}

// Output moderation (loop.h, kModerateDelay): a writer of many small chunks (a shell's echo is
// one write each) has its pipe left alone for a moment between reads. What it writes last must
// still come while it runs, not at its exit: a pipe whose moment is never over would hold
// "END" until the exit drain, 30 s later, past ReadUntil's 10 s read timeout.
TEST(AgentModeration, OutputAfterABurstArrivesWhileTheProcessRuns) {
  AgentProcess agent;
  // One stream at a time: output on the other stream would read the held one first.
  for (const char* redirect : {"", " >&2"}) {
    SCOPED_TRACE(*redirect ? "stderr" : "stdout");
    const std::string sid = *redirect ? "err" : "out";
    AgentConnection c = agent.Connect();
    ASSERT_TRUE(c.Call(AttachReq(sid, 0,
                                 Spec({"sh", "-c",
                                       fmt::format("i=0; while [ $i -lt 3000 ]; do "
                                                   "echo line{0}; i=$((i+1)); done; "
                                                   "echo END{0}; exec sleep 30",
                                                   redirect)})))
                    .ok());
    std::string acc;
    ASSERT_TRUE(ReadUntil(c, acc, "END\n")) << "output after the burst did not arrive";
    EXPECT_EQ(acc.size(), 3000u * 5 + 4);
    EXPECT_EQ(Status(agent, sid)["state"], "running");
    auto r = protocol::CallAgent(agent.socket(),
                                 Json{{"op", "signal"}, {"session_id", sid}, {"signal", 9}});
    ASSERT_TRUE(r.ok()) << r.status();
    Collected rest = ReadStream(c, SIZE_MAX, /*from_start=*/false);
    ASSERT_TRUE(rest.exit.has_value()) << rest.error;
    EXPECT_EQ(rest.out.size() + rest.err.size(), 0u);
  }
}

// Many small writes on both streams, as a chatty build prints: nothing lost or reordered within
// a stream (ReadStream checks ids and offsets), whichever stream is held back when.
TEST(AgentModeration, SmallWritesOnBothStreamsLoseNothing) {
  AgentProcess agent;
  Collected r = RunSession(
      agent, "chatty",
      Spec({"sh", "-c",
            "i=0; while [ $i -lt 3000 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done"}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  std::string want_out, want_err;
  for (int i = 0; i < 3000; ++i) {
    want_out += "o" + std::to_string(i) + "\n";
    want_err += "e" + std::to_string(i) + "\n";
  }
  EXPECT_EQ(r.out, want_out);
  EXPECT_EQ(r.err, want_err);
}

TEST(AgentStdin, WritesArriveInOrderAndCloseIsEof) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("s", 0, Spec({"cat"}, {{"stdin", true}}))).ok());
  std::string expected;
  for (int i = 0; i < 50; ++i) {
    const std::string chunk = fmt::format("line {} {}\n", i, std::string(i * 100, 'x'));
    auto r = Call(agent, StdinReq("s", chunk));
    ASSERT_TRUE(r.ok()) << r.status();
    expected += chunk;
  }
  const std::string binary("\0\xff\x01zz", 5);
  ASSERT_TRUE(Call(agent, StdinReq("s", binary)).ok());
  expected += binary;
  auto closed = Call(agent, Json{{"op", "stdin_close"}, {"session_id", "s"}});
  ASSERT_TRUE(closed.ok()) << closed.status();
  Collected col = ReadStream(c);
  ASSERT_TRUE(col.exit.has_value()) << col.error;
  EXPECT_EQ(col.exit->exit_code, 0);  // cat saw EOF
  EXPECT_EQ(col.out, expected);
}

TEST(AgentStdin, RefusedWithoutStdinAfterCloseAndAfterExit) {
  AgentProcess agent;
  {
    Collected r = RunSession(agent, "plain", Spec({"true"}));
    ASSERT_TRUE(r.exit.has_value());
  }
  auto plain = Call(agent, StdinReq("plain", "x"));
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition) << plain.status();

  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("s", 0, Spec({"cat"}, {{"stdin", true}}))).ok());
  auto bad = Call(agent, Json{{"op", "stdin"}, {"session_id", "s"}, {"data_b64", "@@@"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  ASSERT_TRUE(Call(agent, Json{{"op", "stdin_close"}, {"session_id", "s"}}).ok());
  auto after_close = Call(agent, StdinReq("s", "late"));
  EXPECT_EQ(after_close.status().code(), absl::StatusCode::kFailedPrecondition);
  auto close_twice = Call(agent, Json{{"op", "stdin_close"}, {"session_id", "s"}});
  EXPECT_EQ(close_twice.status().code(), absl::StatusCode::kFailedPrecondition);
  Collected col = ReadStream(c);
  ASSERT_TRUE(col.exit.has_value());
  auto after_exit = Call(agent, StdinReq("s", "x"));
  EXPECT_EQ(after_exit.status().code(), absl::StatusCode::kFailedPrecondition);
  auto unknown = Call(agent, StdinReq("nope", "x"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
}

TEST(AgentStdin, QueueIsBoundedWhileTheProcessDoesNotRead) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("s", 0, Spec({"sleep", "30"}, {{"stdin", true}}))).ok());
  const std::string chunk(64 << 10, 'a');
  size_t accepted = 0;
  absl::Status refused;
  for (int i = 0; i < 200 && refused.ok(); ++i) {
    auto r = Call(agent, StdinReq("s", chunk));
    if (r.ok()) {
      accepted += chunk.size();
    } else {
      refused = r.status();
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  // The pipe holds some (64 KiB by default), the queue 1 MiB, and never more.
  EXPECT_GE(accepted, size_t{1} << 20);
  EXPECT_LE(accepted, (size_t{1} << 20) + (size_t{1} << 20));
  // The loop is not blocked: other requests are served.
  EXPECT_TRUE(Call(agent, Json{{"op", "ping"}}).ok());
  ASSERT_TRUE(Call(agent, Json{{"op", "signal"}, {"session_id", "s"}, {"signal", "KILL"}}).ok());
  Collected col = ReadStream(c);
  ASSERT_TRUE(col.exit.has_value()) << col.error;
  EXPECT_EQ(col.exit->signal, "SIGKILL");
}

TEST(AgentTimeout, TermEndsAProcessThatHonoursIt) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"sleep", "30"}, {{"timeout_s", 1}}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->signal, "SIGTERM");
  EXPECT_TRUE(r.exit->timed_out);
  EXPECT_EQ(Status(agent, "s")["timed_out"], true);
}

TEST(AgentTimeout, KillFollowsTermAfterTheGracePeriod) {
  AgentProcess agent;
  // The ignored TERM is inherited by sleep through exec: only SIGKILL ends the group.
  Collected r = RunSession(
      agent, "s",
      Spec({"sh", "-c", "trap '' TERM; echo ready; sleep 30; echo survived"},
           {{"timeout_s", 1}, {"kill_grace_s", 1}}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->signal, "SIGKILL");
  EXPECT_TRUE(r.exit->timed_out);
  EXPECT_EQ(r.out, "ready\n");
  EXPECT_NE(agent.Log().find("timed out"), std::string::npos) << agent.Log();
}

TEST(AgentTimeout, ExitBeforeTheDeadlineIsNotTimedOut) {
  AgentProcess agent;
  Collected r = RunSession(agent, "s", Spec({"true"}, {{"timeout_s", 60}}));
  ASSERT_TRUE(r.exit.has_value()) << r.error;
  EXPECT_EQ(r.exit->exit_code, 0);
  EXPECT_FALSE(r.exit->timed_out);
}

TEST(AgentTimeout, BadValuesAreRefused) {
  AgentProcess agent;
  for (Json extra : {Json{{"timeout_s", 0}}, Json{{"timeout_s", -1}}, Json{{"timeout_s", "5"}},
                     Json{{"timeout_s", 5}, {"kill_grace_s", 301}}}) {
    AgentConnection c = agent.Connect();
    auto r = c.Call(AttachReq("bad", 0, Spec({"true"}, extra)));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << extra.dump();
  }
}

TEST(AgentPty, ProcessSeesATerminalAndInputIsEchoed) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("t", 0,
                               Spec({"sh", "-c",
                                     "test -t 0 && test -t 1 && echo tty:$TERM; stty size; "
                                     "read line; echo got:$line; exit 3"},
                                    {{"tty", {{"rows", 33}, {"cols", 101}}}})))
                  .ok());
  std::string out;
  ASSERT_TRUE(ReadUntil(c, out, "33 101")) << out;
  EXPECT_NE(out.find("tty:xterm-256color"), std::string::npos) << out;
  ASSERT_TRUE(Call(agent, StdinReq("t", "hello\n")).ok());
  ASSERT_TRUE(ReadUntil(c, out, "got:hello")) << out;
  std::optional<ExitEvent> exit;
  EXPECT_FALSE(ReadUntil(c, out, "never printed", &exit));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);
  // The line discipline echoed the input, and turned \n into \r\n on output.
  EXPECT_NE(out.find("hello\r\n"), std::string::npos) << out;
}

TEST(AgentPty, ResizeIsVisibleToTheProcess) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("t", 0,
                               Spec({"sh", "-c", "stty size; read x; stty size; read y"},
                                    {{"tty", true}})))
                  .ok());
  std::string out;
  ASSERT_TRUE(ReadUntil(c, out, "24 80")) << out;
  auto r = Call(agent, Json{{"op", "resize"}, {"session_id", "t"}, {"rows", 40}, {"cols", 120}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(Call(agent, StdinReq("t", "\n")).ok());
  ASSERT_TRUE(ReadUntil(c, out, "40 120")) << out;
  // ^D at the start of a line is the terminal's EOF: `read y` fails and sh exits 1.
  ASSERT_TRUE(Call(agent, Json{{"op", "stdin_close"}, {"session_id", "t"}}).ok());
  std::optional<ExitEvent> exit;
  EXPECT_FALSE(ReadUntil(c, out, "never printed", &exit));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 1);

  auto bad = Call(agent, Json{{"op", "resize"}, {"session_id", "t"}, {"rows", 0}, {"cols", 1}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  Collected plain = RunSession(agent, "p", Spec({"true"}));
  auto no_tty = Call(agent, Json{{"op", "resize"}, {"session_id", "p"}, {"rows", 5}, {"cols", 5}});
  EXPECT_EQ(no_tty.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AgentPty, CtrlCInterruptsTheForegroundJob) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  ASSERT_TRUE(c.Call(AttachReq("t", 0,
                               Spec({"sh", "-c", "echo start; sleep 30; echo after:$?"},
                                    {{"tty", true}})))
                  .ok());
  std::string out;
  ASSERT_TRUE(ReadUntil(c, out, "start")) << out;
  // Wait until sleep runs (the process list shows it), so that the ^C reaches it.
  for (int i = 0; i < 500; ++i) {
    auto p = Call(agent, Json{{"op", "processes"}});
    ASSERT_TRUE(p.ok());
    bool sleeping = false;
    for (const auto& e : (*p)["processes"]) sleeping = sleeping || e["comm"] == "sleep";
    if (sleeping) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(Call(agent, StdinReq("t", "\x03")).ok());
  std::optional<ExitEvent> exit;
  ReadUntil(c, out, "never printed", &exit);
  ASSERT_TRUE(exit.has_value()) << out;
  // sh itself gets SIGINT too (the whole foreground group does).
  EXPECT_EQ(exit->signal, "SIGINT") << out;
}

TEST(AgentProcesses, ListsSessionProcessesButNotTheAgent) {
  AgentProcess agent;
  AgentConnection c = agent.Connect();
  ASSERT_TRUE(
      c.Call(AttachReq("s", 0, Spec({"sh", "-c", "sleep 31 & sleep 32; wait"}))).ok());
  Json sh, child, sleeper;
  for (int i = 0; i < 500 && (sh.is_null() || sleeper.is_null()); ++i) {
    auto r = Call(agent, Json{{"op", "processes"}});
    ASSERT_TRUE(r.ok()) << r.status();
    // A child sh forked but has not exec'd yet carries sh's argv too: the sh is the one whose
    // child `sleep 32` is.
    std::vector<Json> shs;
    sh = sleeper = Json();
    for (const auto& p : (*r)["processes"]) {
      EXPECT_NE(p["pid"], agent.pid()) << "the agent lists itself";
      if (p["argv"] == Json::array({"sh", "-c", "sleep 31 & sleep 32; wait"})) shs.push_back(p);
      if (p["argv"] == Json::array({"sleep", "31"})) child = p;
      if (p["argv"] == Json::array({"sleep", "32"})) sleeper = p;
    }
    for (const Json& p : shs) {
      if (!sleeper.is_null() && p["pid"] == sleeper["ppid"]) sh = p;
    }
    if (sh.is_null() || sleeper.is_null()) std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(sh.is_null());
  ASSERT_FALSE(sleeper.is_null());
  EXPECT_EQ(sh["session_id"], "s");
  EXPECT_EQ(sh["ppid"], agent.pid());
  EXPECT_EQ(sleeper["session_id"], "s");
  EXPECT_EQ(sleeper["ppid"], sh["pid"]);
  if (!child.is_null()) {
    EXPECT_EQ(child["session_id"], "s");  // a background job
  }
  EXPECT_EQ(sleeper["uid"], ::getuid());
  EXPECT_TRUE(sleeper["started_at"].is_string());
  ASSERT_TRUE(Call(agent, Json{{"op", "signal"}, {"session_id", "s"}, {"signal", "KILL"}}).ok());
  Collected col = ReadStream(c);
  ASSERT_TRUE(col.exit.has_value());
}

// Issue 13: a request nested past the limit is refused before the agent builds a tree of it,
// and the agent keeps serving.
TEST(Agent, DeeplyNestedRequestIsRefused) {
  AgentProcess agent;
  const std::string deep = std::string(400000, '[') + std::string(400000, ']');
  for (const std::string& request :
       {R"({"op":"attach","session_id":"d","spec":)" + deep + "}", R"({"op":)" + deep + "}"}) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, agent.socket().c_str());
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string bytes = protocol::EncodeFrame(FrameType::kHello, "{}") +
                              protocol::EncodeFrame(FrameType::kRequest, request);
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << std::strerror(errno);
      sent += static_cast<size_t>(n);
    }
    protocol::FrameDecoder d;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
      d.Feed(std::string_view(buf, static_cast<size_t>(n)));
    }
    ::close(fd);
    auto hello = d.Next();
    ASSERT_TRUE(hello.ok() && hello->has_value()) << agent.Log();
    auto resp = d.Next();
    ASSERT_TRUE(resp.ok() && resp->has_value()) << agent.Log();
    Json j = Json::parse((*resp)->payload);
    EXPECT_EQ(j["ok"], false);
    EXPECT_EQ(j["error"]["code"], "invalid_argument");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("nests deeper than 64"),
              std::string::npos)
        << j;
  }
  auto ping = protocol::CallAgent(agent.socket(), Json{{"op", "ping"}});
  EXPECT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(Status(agent, "d")["state"], "unknown");
}


// ---- Issue 13 (finding 6): guest-chosen argv is bounded before it reaches a reply ---------

// The raw payload of the response to `request` (the reply's size is the bound under test).
std::string RawCall(const AgentProcess& agent, const Json& request) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, agent.socket().c_str());
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string bytes = protocol::EncodeFrame(FrameType::kHello, "{}") +
                            protocol::EncodeFrame(FrameType::kRequest, request.dump());
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  protocol::FrameDecoder d;
  char buf[65536];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) d.Feed(std::string_view(buf, static_cast<size_t>(n)));
  ::close(fd);
  auto hello = d.Next();
  EXPECT_TRUE(hello.ok() && hello->has_value());
  auto resp = d.Next();
  EXPECT_TRUE(resp.ok() && resp->has_value()) << agent.Log();
  if (!resp.ok() || !resp->has_value()) return "";
  return std::move((*resp)->payload);
}

// A session `sh -c 'sleep 60 & wait' x <args...>`: sh keeps the huge argv while it waits.
void StartHugeArgv(const AgentProcess& agent, const std::string& sid,
                   const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"sh", "-c", "sleep 60 & wait", "x"};
  argv.insert(argv.end(), args.begin(), args.end());
  AgentConnection c = agent.Connect();
  auto r = c.Call(AttachReq(sid, 0, Spec(argv)));
  ASSERT_TRUE(r.ok()) << r.status();
}

// The entries of a processes reply whose argv is that of StartHugeArgv.
std::vector<Json> HugeArgvEntries(const Json& reply) {
  std::vector<Json> out;
  for (const auto& p : reply["processes"]) {
    const Json& a = p["argv"];
    if (a.size() >= 3 && a[0] == "sh" && a[2] == "sleep 60 & wait") out.push_back(p);
  }
  return out;
}

void ExpectArgvBounded(const Json& p) {
  const Json& argv = p["argv"];
  EXPECT_LE(argv.size(), protocol::kMaxArgvEntries);
  size_t total = 0;
  for (const auto& a : argv) {
    EXPECT_LE(a.get_ref<const std::string&>().size(), protocol::kMaxArgBytes);
    total += a.get_ref<const std::string&>().size();
  }
  EXPECT_LE(total, protocol::kMaxArgvBytes);
}

TEST(AgentProcesses, HugeArgvIsCutAndFlagged) {
  AgentProcess agent;
  StartHugeArgv(agent, "empty", std::vector<std::string>(32000, ""));
  StartHugeArgv(agent, "long", std::vector<std::string>(64, std::string(4096, 'a')));
  std::vector<Json> huge;
  std::string payload;
  // Until both shells' `sleep` children have exec'd: a child between sh's fork and its exec
  // still carries the shell's huge argv, and is listed as a third huge entry.
  auto sleeps = [](const Json& reply) {
    int n = 0;
    for (const auto& p : reply["processes"]) n += p["argv"].size() == 2 && p["argv"][0] == "sleep";
    return n;
  };
  for (int i = 0; i < 500; ++i) {
    payload = RawCall(agent, Json{{"op", "processes"}});
    const Json listed = Json::parse(payload);
    huge = HugeArgvEntries(listed);
    if (huge.size() == 2 && sleeps(listed) == 2) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(huge.size(), 2u) << payload.substr(0, 2000);
  EXPECT_LE(payload.size(), protocol::kMaxGuestReplyBytes);
  const Json reply = Json::parse(payload);
  EXPECT_EQ(reply["truncated"], false);
  for (const Json& p : huge) {
    EXPECT_EQ(p["argv_truncated"], true) << p["session_id"];
    ExpectArgvBounded(p);
  }
  for (const Json& p : huge) {
    if (p["session_id"] == "empty") {
      EXPECT_EQ(p["argv"].size(), protocol::kMaxArgvEntries);
      EXPECT_EQ(p["argv"][4], "");
    } else {
      // 4 short entries, then as many 4096-byte ones as the 32 KiB allow, the last one cut.
      EXPECT_EQ(p["argv"][4], std::string(4096, 'a'));
    }
  }
  // Small argv (the sleeps, sh's children) stays whole and unflagged.
  for (const auto& p : reply["processes"]) {
    if (p["argv"].size() >= 3 && p["argv"][2] == "sleep 60 & wait") continue;
    EXPECT_EQ(p["argv_truncated"], false) << p;
  }
}

TEST(AgentProcesses, ListPastTheReplyBoundIsTruncatedAndStaysUnderIt) {
  AgentProcess agent;
  // ~32 KiB of argv each: 150 of them are more than the 4 MiB a reply may hold.
  constexpr int kSessions = 150;
  const std::vector<std::string> args(8, std::string(4096, 'b'));
  for (int i = 0; i < kSessions; ++i) StartHugeArgv(agent, fmt::format("s{}", i), args);
  std::string payload;
  Json reply;
  for (int i = 0; i < 500; ++i) {
    payload = RawCall(agent, Json{{"op", "processes"}});
    reply = Json::parse(payload);
    // Until every sh has exec'd, some entries still have small argv.
    if (reply["truncated"] == true) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LE(payload.size(), protocol::kMaxGuestReplyBytes);
  EXPECT_EQ(reply["ok"], true);
  EXPECT_EQ(reply["truncated"], true);
  // Close to the bound (entries are ~33 KiB), never past it.
  EXPECT_GT(payload.size(), protocol::kMaxGuestReplyBytes - (64u << 10));
  const std::vector<Json> huge = HugeArgvEntries(reply);
  EXPECT_LT(huge.size(), static_cast<size_t>(kSessions));
  for (const Json& p : huge) ExpectArgvBounded(p);
  // The agent still serves.
  EXPECT_TRUE(Call(agent, Json{{"op", "ping"}}).ok());
}

}  // namespace
}  // namespace sbx::agent
