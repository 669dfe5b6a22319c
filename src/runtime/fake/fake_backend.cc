#include "runtime/fake/fake_backend.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/files.h"
#include "common/loopback.h"
#include "common/status_util.h"
#include "protocol/protocol.h"

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr auto kReadyTimeout = 5s;
constexpr const char* kDefaultPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

struct ProcStat {
  char state = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
  pid_t sid = 0;
};

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  std::string s = ReadFileOrEmpty(fmt::format("/proc/{}/stat", pid));
  // "pid (comm) state ppid pgrp session ...": comm may contain anything, parse after the
  // last ')'.
  size_t close = s.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  ProcStat st;
  if (std::sscanf(s.c_str() + close + 1, " %c %d %d %d", &st.state, &st.ppid, &st.pgid,
                  &st.sid) != 4) {
    return std::nullopt;
  }
  return st;
}

// True when `pid` is a live sbx-agent serving `socket`: guards every kill of a pid read from
// a file or the store against pid reuse.
bool IsOurAgent(pid_t pid, const std::string& socket) {
  if (pid <= 0) return false;
  std::string cmdline = ReadFileOrEmpty(fmt::format("/proc/{}/cmdline", pid));
  std::vector<std::string> args;
  size_t start = 0;
  while (start < cmdline.size()) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string::npos) end = cmdline.size();
    args.push_back(cmdline.substr(start, end - start));
    start = end + 1;
  }
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--listen" && args[i + 1] == socket) return true;
  }
  return false;
}

// Calls fn(pid, state) for every live process (zombies skipped) whose session id is `sid`.
template <typename Fn>
absl::Status ForEachLiveInSession(pid_t sid, Fn fn) {
  DIR* d = ::opendir("/proc");
  if (!d) return ErrnoStatus(errno, "opendir(/proc)");
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    auto st = ReadProcStat(static_cast<pid_t>(pid));
    if (!st || st->sid != sid || st->state == 'Z' || st->state == 'X') continue;
    fn(static_cast<pid_t>(pid), st->state);
  }
  ::closedir(d);
  return absl::OkStatus();
}

// Kills every process whose session id is `sid` (the agent and all its sessions), repeating
// while forks race with the scan. Returns once none is left alive (zombies do not count).
void KillSession(pid_t sid) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    bool found = false;
    if (!ForEachLiveInSession(sid, [&](pid_t pid, char) {
          found = true;
          ::kill(pid, SIGKILL);
        }).ok()) {
      return;
    }
    if (!found) return;
    std::this_thread::sleep_for(2ms);
  }
}

// Sends `sig` to every live process whose session id is `sid`. With SIGSTOP it repeats until
// every one of them is stopped, so a fork racing the scan is caught too (bounded by 5 s).
absl::Status SignalSession(pid_t sid, int sig) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    bool all_stopped = true;
    SBX_RETURN_IF_ERROR(Annotate(ForEachLiveInSession(sid, [&](pid_t pid, char state) {
                                   if (sig == SIGSTOP && state == 'T') return;
                                   all_stopped = false;
                                   ::kill(pid, sig);
                                 }),
                                 "signal sandbox"));
    if (sig != SIGSTOP || all_stopped) return absl::OkStatus();
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          fmt::format("freeze: processes of session {} still not stopped after 5 s", sid));
    }
    std::this_thread::sleep_for(1ms);
  }
}

// Stops the agent `pid` serving `socket` and every process of its session. SIGTERM first:
// the agent then kills and reaps all its descendants itself (it is their subreaper), so no
// orphan or zombie is handed to the host's init. SIGKILL and a scan by session id after 2 s.
void StopAgent(pid_t pid, const std::string& socket) {
  int status;
  // 0: our own live child (cannot have been replaced by another process); -1: not ours, so
  // only its command line proves it is still that agent.
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  const bool our_child = r == 0;
  if (r == pid) {
    // It had died on its own: its sessions still carry its session id.
    KillSession(pid);
    return;
  }
  if (!our_child && !IsOurAgent(pid, socket)) return;
  ::kill(pid, SIGTERM);
  ::kill(pid, SIGCONT);  // a paused (stopped) agent must run to handle the SIGTERM
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < deadline) {
    if (our_child) {
      gone = ::waitpid(pid, &status, WNOHANG) == pid;
    } else {
      auto st = ReadProcStat(pid);
      gone = !st || st->state == 'Z' || st->state == 'X';
    }
    if (!gone) std::this_thread::sleep_for(2ms);
  }
  if (!gone) ::kill(pid, SIGKILL);
  KillSession(pid);
  if (our_child && !gone) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

class FakeInstance : public Instance {
 public:
  FakeInstance(std::string id, std::string dir, pid_t pid)
      : id_(std::move(id)), dir_(std::move(dir)), pid_(pid) {}
  ~FakeInstance() override = default;

  const std::string& id() const override { return id_; }
  std::string AgentSocketPath() const override { return dir_ + "/agent.sock"; }
  Json Persist() const override {
    return Json{{"pid", pid_}, {"socket", AgentSocketPath()}, {"dir", dir_}};
  }

  absl::Status Destroy() override {
    if (pid_ > 0) {
      StopAgent(pid_, AgentSocketPath());
      pid_ = 0;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (ec) {
      return absl::InternalError(
          fmt::format("destroy sandbox {}: remove {}: {}", id_, dir_, ec.message()));
    }
    return absl::OkStatus();
  }

  // No network namespace: the sandbox's loopback is the host's.
  absl::StatusOr<UniqueFd> DialPort(uint16_t port, bool ipv6) const override {
    UniqueFd sock(::socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) return ErrnoStatus(errno, "fake dial port: socket()");
    sockaddr_storage ss;
    const socklen_t len = LoopbackSockaddr(port, ipv6, &ss);
    if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
      if (errno == ECONNREFUSED) {
        return absl::UnavailableError(fmt::format("fake dial port {}: nothing listening", port));
      }
      return ErrnoStatus(errno, fmt::format("fake dial port: connect({})", port));
    }
    return sock;
  }

  // No cgroup here: pause stops the agent's whole session with SIGSTOP. Unlike a freezer, a
  // stopped process is visible to its parent, which is fine for tests.
  absl::Status Freeze() override {
    if (pid_ <= 0) return absl::FailedPreconditionError(fmt::format("freeze {}: no agent", id_));
    absl::Status st = SignalSession(pid_, SIGSTOP);
    if (!st.ok()) {
      (void)SignalSession(pid_, SIGCONT);
      return Annotate(st, fmt::format("freeze {}", id_));
    }
    return absl::OkStatus();
  }
  absl::Status Thaw() override {
    if (pid_ <= 0) return absl::FailedPreconditionError(fmt::format("thaw {}: no agent", id_));
    return Annotate(SignalSession(pid_, SIGCONT), fmt::format("thaw {}", id_));
  }
  absl::StatusOr<bool> IsFrozen() const override {
    auto st = ReadProcStat(pid_);
    return st.has_value() && st->state == 'T';
  }

 private:
  std::string id_;
  std::string dir_;
  pid_t pid_;
};

absl::Status Ping(const std::string& socket, int timeout_ms) {
  auto r = protocol::CallAgent(socket, protocol::Json{{"op", "ping"}}, timeout_ms);
  return r.ok() ? absl::OkStatus() : r.status();
}

// Starts the agent with stdin /dev/null and stdout/stderr appended to `log_path`, in a session
// of its own. Returns 0 or posix_spawn's error.
int SpawnAgent(const std::string& path, std::vector<std::string>& args, std::vector<std::string>& env,
               const std::string& log_path, pid_t* pid) {
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  // setsid: the agent leads a session that all its processes share, for Destroy(). Default
  // signal dispositions and an empty mask: sbxd's own (e.g. ignored SIGCHLD) must not leak.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETSIGMASK);
  const int rc = ::posix_spawn(pid, path.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc;
}

// Ready when a ping answers. Polls with a short backoff, bounded; stops early if the agent
// died (its log says why), and then sets *reaped: Destroy must not wait for it again.
absl::Status WaitForAgent(const std::string& id, const std::string& socket, pid_t pid,
                          const std::string& log_path, bool* reaped) {
  const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
  auto backoff = 1ms;
  absl::Status last = absl::UnavailableError("no attempt");
  for (;;) {
    last = Ping(socket, 1000);
    if (last.ok()) return absl::OkStatus();
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      *reaped = true;
      return absl::UnavailableError(fmt::format(
          "create sandbox {}: agent exited ({}) before answering: {}", id,
          WIFEXITED(status) ? fmt::format("code {}", WEXITSTATUS(status))
                            : fmt::format("signal {}", WTERMSIG(status)),
          Tail(ReadFileOrEmpty(log_path), 1000)));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "create sandbox {}: agent did not answer a ping within {} s: {}", id,
          std::chrono::duration_cast<std::chrono::seconds>(kReadyTimeout).count(),
          std::string(last.message())));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, 50ms);
  }
}

}  // namespace

FakeBackend::FakeBackend(std::string state_dir, std::string agent_path, size_t agent_buffer_bytes)
    : state_dir_(std::move(state_dir)),
      agent_path_(std::move(agent_path)),
      agent_buffer_bytes_(agent_buffer_bytes) {}

std::string FakeBackend::SandboxDir(const std::string& id) const {
  return fmt::format("{}/sandboxes/{}", state_dir_, id);
}

absl::Status FakeBackend::Probe() {
  if (::access(agent_path_.c_str(), X_OK) != 0) {
    return ErrnoStatus(errno, fmt::format("fake runtime: agent binary: access({})", agent_path_));
  }
  std::error_code ec;
  fs::create_directories(state_dir_ + "/sandboxes", ec);
  if (ec) {
    return absl::FailedPreconditionError(fmt::format(
        "fake runtime: create {}/sandboxes: {}", state_dir_, ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<InstancePtr> FakeBackend::Create(const SandboxSpec& spec) {
  if (!ValidId(spec.id)) {
    return absl::InvalidArgumentError(fmt::format("create sandbox: invalid id \"{}\"", spec.id));
  }
  const std::string dir = SandboxDir(spec.id);
  const std::string socket = dir + "/agent.sock";
  if (socket.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(fmt::format(
        "create sandbox {}: socket path {} is longer than {} bytes", spec.id, socket,
        sizeof(sockaddr_un::sun_path) - 1));
  }
  std::error_code ec;
  fs::create_directories(state_dir_ + "/sandboxes", ec);
  if (ec) {
    return absl::InternalError(fmt::format("create sandbox {}: create {}/sandboxes: {}",
                                           spec.id, state_dir_, ec.message()));
  }
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, fmt::format("create sandbox {}: mkdir({})", spec.id, dir));
  }
  // From here on, a failure removes everything created so far.
  auto instance = std::make_unique<FakeInstance>(spec.id, dir, 0);
  auto fail = [&](absl::Status s) -> absl::Status {
    (void)instance->Destroy();
    return s;
  };
  if (::mkdir((dir + "/home").c_str(), 0700) != 0) {
    return fail(ErrnoStatus(errno, fmt::format("create sandbox {}: mkdir({}/home)", spec.id, dir)));
  }
  // No isolation here, so the file API gets a directory of its own as the sandbox's root
  // (sessions still see the host's tree).
  if (::mkdir((dir + "/root").c_str(), 0755) != 0) {
    return fail(ErrnoStatus(errno, fmt::format("create sandbox {}: mkdir({}/root)", spec.id, dir)));
  }

  // The agent sees only the sandbox's environment, never sbxd's.
  std::map<std::string, std::string> env_map = spec.env;
  env_map.emplace("PATH", kDefaultPath);
  env_map.emplace("HOME", dir + "/home");
  std::vector<std::string> env;
  for (const auto& [k, v] : env_map) env.push_back(k + "=" + v);
  std::vector<std::string> args = {agent_path_, "--listen", socket, "--no-user-switch",
                                   "--sandbox-id", spec.id, "--root", dir + "/root",
                                   "--workdir", spec.tmpl.workdir};
  if (agent_buffer_bytes_ > 0) {
    args.push_back("--buffer-bytes");
    args.push_back(std::to_string(agent_buffer_bytes_));
  }
  const std::string log_path = dir + "/agent.log";
  pid_t pid = -1;
  if (const int rc = SpawnAgent(agent_path_, args, env, log_path, &pid); rc != 0) {
    return fail(ErrnoStatus(rc, fmt::format("create sandbox {}: start agent: posix_spawn({})",
                                            spec.id, agent_path_)));
  }
  instance = std::make_unique<FakeInstance>(spec.id, dir, pid);

  if (absl::Status st = WriteFileContents(dir + "/agent.pid", fmt::format("{}\n", pid)); !st.ok()) {
    return fail(Annotate(st, fmt::format("create sandbox {}", spec.id)));
  }
  bool reaped = false;
  if (absl::Status ready = WaitForAgent(spec.id, socket, pid, log_path, &reaped); !ready.ok()) {
    if (reaped) instance = std::make_unique<FakeInstance>(spec.id, dir, 0);
    return fail(ready);
  }
  return InstancePtr(std::move(instance));
}

absl::StatusOr<InstancePtr> FakeBackend::Adopt(const std::string& id, const Json& persisted) {
  if (!ValidId(id)) {
    return absl::InvalidArgumentError(fmt::format("adopt sandbox: invalid id \"{}\"", id));
  }
  const std::string dir = SandboxDir(id);
  pid_t pid = 0;
  try {
    if (!persisted.is_object() || !persisted.contains("pid") ||
        !persisted["pid"].is_number_integer()) {
      return absl::InvalidArgumentError(
          fmt::format("adopt sandbox {}: persisted state has no integer \"pid\"", id));
    }
    pid = persisted["pid"].get<pid_t>();
    if (persisted.contains("dir") && persisted["dir"] != dir) {
      return absl::InvalidArgumentError(fmt::format(
          "adopt sandbox {}: persisted dir {} is not {}", id, persisted["dir"].dump(), dir));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fmt::format("adopt sandbox {}: {}", id, e.what()));
  }
  const std::string socket = dir + "/agent.sock";
  if (!fs::exists(dir)) {
    return absl::NotFoundError(fmt::format("adopt sandbox {}: {} is gone", id, dir));
  }
  if (!IsOurAgent(pid, socket)) {
    return absl::NotFoundError(
        fmt::format("adopt sandbox {}: agent pid {} is not running", id, pid));
  }
  // A paused agent is stopped and cannot answer; it stays paused.
  auto proc = ReadProcStat(pid);
  const bool stopped = proc.has_value() && proc->state == 'T';
  if (auto s = stopped ? absl::OkStatus() : Ping(socket, 2000); !s.ok()) {
    return absl::UnavailableError(fmt::format("adopt sandbox {}: agent pid {} does not answer: {}",
                                              id, pid, std::string(s.message())));
  }
  return InstancePtr(std::make_unique<FakeInstance>(id, dir, pid));
}

absl::Status FakeBackend::RemoveDir(const std::string& dir) {
  const std::string socket = dir + "/agent.sock";
  const pid_t pid = static_cast<pid_t>(std::atol(ReadFileOrEmpty(dir + "/agent.pid").c_str()));
  if (pid > 0) StopAgent(pid, socket);
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return absl::InternalError(fmt::format("remove {}: {}", dir, ec.message()));
  return absl::OkStatus();
}

absl::Status FakeBackend::Remove(const std::string& id) {
  if (!ValidId(id)) {
    return absl::InvalidArgumentError(fmt::format("remove sandbox: invalid id \"{}\"", id));
  }
  if (auto s = RemoveDir(SandboxDir(id)); !s.ok()) {
    return Annotate(s, fmt::format("remove sandbox {}", id));
  }
  return absl::OkStatus();
}

absl::Status FakeBackend::Sweep(const std::set<std::string>& known_ids) {
  const std::string root = state_dir_ + "/sandboxes";
  std::error_code ec;
  if (!fs::exists(root, ec)) return absl::OkStatus();
  absl::Status first_error;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string id = entry.path().filename().string();
    if (known_ids.count(id)) continue;
    if (auto s = RemoveDir(entry.path().string()); !s.ok() && first_error.ok()) {
      first_error = Annotate(s, "sweep fake sandboxes");
    }
  }
  if (ec && first_error.ok()) {
    first_error = absl::InternalError(
        fmt::format("sweep fake sandboxes: list {}: {}", root, ec.message()));
  }
  return first_error;
}

}  // namespace sbx::runtime
