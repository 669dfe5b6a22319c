#include "agent/agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <termios.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "agent/event_log.h"
#include "agent/files.h"
#include "agent/oom.h"
#include "agent/spawn.h"
#include "agent/users.h"
#include "common/log_format.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "common/unique_fd.h"
#include "protocol/limits.h"
#include "protocol/protocol.h"

extern char** environ;

namespace sbx::agent {
namespace {

using protocol::EncodeFrame;
using protocol::FrameType;
using protocol::Json;
using protocol::Stream;

constexpr size_t kReadChunk = 64 * 1024;        // one pipe read (a pipe holds 64 KiB)
// Reads that pile up while every connection is busy are merged into events of up to this many
// bytes (EventLog::AppendOutput): per-event costs (frame, SSE event, write) then shrink as the
// load grows. An SSE data line carries 4/3 of it in base64.
constexpr size_t kMaxEventBytes = 256 * 1024;
constexpr size_t kOutBufferTarget = 256 * 1024;  // frames queued per connection at a time
constexpr int kReadsPerWakeup = 16;              // fairness between pipes and sockets
constexpr size_t kMaxConnections = 1024;
constexpr size_t kMaxSessionIdLength = 256;
// Bytes of stdin a session may have queued and not yet taken by its process. Bounded because
// the agent lives inside the sandbox's memory limit; a full queue is the host's signal to wait
// (resource_exhausted), not a reason to block the loop.
constexpr size_t kMaxStdinQueue = 1 << 20;
// Between the SIGTERM of a session's timeout and the SIGKILL, unless the spec says otherwise.
constexpr int kDefaultKillGraceS = 5;
constexpr int kMaxKillGraceS = 300;
constexpr int64_t kMaxTimeoutS = 30LL * 86400;
constexpr size_t kMaxFileWorkers = 64;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// agent.log gets the JSON lines of sbxd's own log (common/log_format.h), so that one tool reads
// both: every line names the sandbox, a session's lines the session too.
void WriteLogLine(const AgentOptions& opts, std::string_view level, std::string_view msg,
                  std::string_view session) {
  const log::Field fields[] = {{"sandbox", opts.sandbox_id}, {"session", session}};
  const log::Attr attrs[] = {log::Attr("component", "sbx-agent")};
  std::string line;
  log::AppendRecord(line, log::Format::kJson,
                    log::Record{std::chrono::system_clock::now(), level, msg, fields, attrs});
  (void)!::write(opts.log_fd, line.data(), line.size());
}

// The message is cut: it may embed what a guest chose (a path, a name), and every reply but
// "processes" and "list" must stay under kMaxSmallResponseBytes (8 KiB even at JSON's six
// bytes per escaped byte is well under it).
Json ErrorJson(const absl::Status& s) {
  return Json{{"ok", false},
              {"error",
               {{"code", protocol::ErrorCodeName(s.code())},
                {"message", CutField(std::string(s.message()))}}}};
}

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

// Standard padded base64. The agent cannot use common/encoding.cc: its object also holds the
// OpenSSL-based digests, which the static binary does not link.
std::optional<std::string> DecodeBase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      if (in[i + k] == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after padding
      v[k] = value(in[i + k]);
      if (v[k] < 0) return std::nullopt;
    }
    const uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return out;
}

struct Session {
  explicit Session(size_t budget) : log(budget, kMaxEventBytes) {}
  std::string id;
  pid_t pid = -1;
  bool exited = false;
  int wait_status = 0;
  uint64_t oom_kills_at_start = 0;  // the sandbox's OOM counter before the spawn
  bool oom_killed = false;
  std::string started_at;
  std::string exited_at;
  EventLog log;
  UniqueFd pipe_fd[2];      // stdout, stderr read ends; closed at EOF or exit
  uint64_t pipe_token[2] = {0, 0};  // epoll registration, 0 = not watched (paused or closed)
  std::vector<uint64_t> conns;      // ids of attached connections
  bool finished = false;            // exit event delivered: in Agent::finished_

  bool tty = false;            // pipe_fd[0] is the pty master (one output stream)
  bool stdin_enabled = false;  // created with stdin (always for a tty)
  UniqueFd stdin_fd;           // pipe write end or a dup of the pty master
  uint64_t stdin_token = 0;    // EPOLLOUT registration while the queue waits for room
  std::string stdin_buf;       // queued bytes from stdin_off on
  size_t stdin_off = 0;
  bool stdin_close_requested = false;  // stdin_close seen: fd closes once the queue drained
  std::string stdin_error;     // why stdin stopped early (the process closed its end)

  UniqueFd timer_fd;           // the timeout, then the kill grace period
  uint64_t timer_token = 0;
  int kill_grace_s = kDefaultKillGraceS;
  bool timed_out = false;      // SIGTERM of the timeout sent
  bool kill_sent = false;
};

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  uint64_t token = 0;
  bool want_out = false;  // EPOLLOUT registered
  protocol::FrameDecoder decoder;
  int frames_seen = 0;  // hello, then request; anything later is ignored for now
  std::string out;
  size_t out_off = 0;
  uint64_t out_last_id = 0;  // highest event id in `out`
  bool close_after_flush = false;
  Session* session = nullptr;  // set while streaming an attach
  uint64_t cursor = 0;         // next event id to queue
  bool exit_queued = false;
};

class Agent {
 public:
  explicit Agent(AgentOptions opts) : opts_(std::move(opts)) {}
  absl::Status Init();
  int Run();

 private:
  enum class Kind { kListen, kSignal, kConn, kPipe, kStdin, kTimer };
  struct Watch {
    Kind kind;
    uint64_t conn_id = 0;
    Session* session = nullptr;
    int stream_index = 0;
  };

  void Log(std::string_view level, std::string_view msg, std::string_view session = {}) {
    WriteLogLine(opts_, level, msg, session);
  }

  uint64_t AddWatch(int fd, uint32_t events, Watch w);
  void DelWatch(int fd, uint64_t& token);

  void OnListen();
  void OnSignal();
  void OnConnReadable(Connection& c);
  void OnPipe(Session& s, int idx);
  void FlushStdin(Session& s);
  void CloseStdin(Session& s);
  void OnTimer(Session& s);
  void ArmTimer(Session& s, int64_t seconds);

  void HandleFrame(Connection& c, protocol::Frame frame);
  void HandleRequest(Connection& c, const std::string& payload, protocol::FrameDecoder& rest);
  // Hands a file request (files.h) to a forked worker child; the loop forgets the connection.
  void ForkFileWorker(Connection& c, const Json& req, protocol::FrameDecoder& rest);
  Json HandleAttach(Connection& c, const Json& req, bool& streaming);
  Json HandleStatus(const Json& req);
  Json HandleSignal(const Json& req);
  Json HandleStdin(const Json& req, bool close);
  Json HandleResize(const Json& req);
  // The payload itself, built as text (bounded.h): the list is guest-sized.
  std::string HandleProcesses();
  absl::StatusOr<Session*> FindSession(const Json& req, std::string_view op);
  absl::StatusOr<Session*> StartSession(const std::string& id, const Json& spec);

  void Pump(Connection& c);
  void Refill(Connection& c);
  void PumpSession(Session& s);
  void CloseConn(uint64_t id);
  void UpdateConnEvents(Connection& c, bool want_out);

  void PausePipe(Session& s, int idx);
  void ResumePipes(Session& s);
  void ClosePipe(Session& s, int idx);
  void DrainPipe(Session& s, int idx);
  void Reap();
  void OnSessionExit(Session& s, int status);
  void OnDelivered(Session& s);
  void Shutdown();

  AgentOptions opts_;
  UniqueFd epoll_;
  UniqueFd signal_fd_;
  UniqueFd listen_fd_;
  UniqueFd oom_fd_;
  UniqueFd root_fd_;  // O_PATH fd of opts_.root, for file workers
  std::unordered_map<pid_t, bool> file_workers_;  // live worker pids (not sessions)
  bool listen_paused_ = false;
  std::chrono::steady_clock::time_point listen_resume_at_;
  bool bound_path_ = false;
  bool stop_ = false;
  uint64_t next_token_ = 1;
  uint64_t next_conn_id_ = 1;
  std::unordered_map<uint64_t, Watch> watches_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  std::unordered_map<pid_t, Session*> by_pid_;  // running sessions only
  std::vector<Session*> finished_;  // sessions whose exit event was delivered, oldest first
  char read_buf_[kReadChunk];
};

uint64_t Agent::AddWatch(int fd, uint32_t events, Watch w) {
  const uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    Log("error", fmt::format("epoll_ctl(ADD, {}): {}", fd, ErrnoMessage(errno)));
    return 0;
  }
  watches_[token] = w;
  return token;
}

void Agent::DelWatch(int fd, uint64_t& token) {
  if (token == 0) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  watches_.erase(token);
  token = 0;
}

absl::Status Agent::Init() {
  // Session processes inherit 0-2 only through dup2; keeping them open here guarantees that
  // pipe ends are >= 3.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int n = ::open("/dev/null", O_RDWR);
      if (n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
    }
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  // Outside a pid namespace, orphans of sessions would go to the host's init; become their
  // reaper so that the agent behaves the same as PID 1.
  if (::getpid() != 1) ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  ::signal(SIGPIPE, SIG_IGN);
  // An inherited SIG_IGN for SIGCHLD would make the kernel auto-reap and hide exit statuses.
  ::signal(SIGCHLD, SIG_DFL);

  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return ErrnoStatus(errno, "agent init: epoll_create1");

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  // As PID 1 of a pid namespace the agent must not take SIGTERM or SIGINT at all. The kernel
  // drops signals that sandbox processes send to their init only while init leaves them at
  // SIG_DFL; a blocked signal is queued instead, and `kill -TERM 1` from sandbox root would then
  // shut the agent down. sbxd ends a sandbox with SIGKILL, which the kernel always delivers
  // from the host's namespace. Outside a pid namespace (tests, --listen), they stop the agent.
  if (::getpid() != 1) {
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
  }
  if (::sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) {
    return ErrnoStatus(errno, "agent init: sigprocmask");
  }
  signal_fd_.Reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_) return ErrnoStatus(errno, "agent init: signalfd");
  if (AddWatch(signal_fd_.get(), EPOLLIN, {Kind::kSignal}) == 0) {
    return absl::InternalError("agent init: cannot watch the signalfd");
  }

  if (opts_.oom_counter_fd >= 0) {
    // sbxd passes an fd it opened; one that cannot be read is a wiring bug worth failing on
    // rather than silently losing OOM reports.
    if (!ReadOomKillCount(opts_.oom_counter_fd)) {
      return ErrnoStatus(errno, fmt::format("agent init: pread(--oom-counter-fd {})",
                                            opts_.oom_counter_fd));
    }
    oom_fd_.Reset(opts_.oom_counter_fd);
    ::fcntl(oom_fd_.get(), F_SETFD, FD_CLOEXEC);
  }

  SBX_RETURN_IF_ERROR(PrepareIdentity(&opts_.identity));
  for (int fd : opts_.identity.cgroup_procs_fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (opts_.identity.userns_fd >= 0) ::fcntl(opts_.identity.userns_fd, F_SETFD, FD_CLOEXEC);
  root_fd_.Reset(::open(opts_.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd_) return ErrnoStatus(errno, fmt::format("agent init: open(--root {})", opts_.root));

  if (opts_.listen_fd >= 0) {
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (::getsockopt(opts_.listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0) {
      return ErrnoStatus(errno, fmt::format("agent init: getsockopt(--listen-fd {})",
                                            opts_.listen_fd));
    }
    if (!accepting) {
      return absl::InvalidArgumentError(
          fmt::format("agent init: --listen-fd {} is not a listening socket", opts_.listen_fd));
    }
    listen_fd_.Reset(opts_.listen_fd);
  } else {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (opts_.listen_path.empty() || opts_.listen_path.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(fmt::format(
          "agent init: socket path \"{}\" is empty or too long", opts_.listen_path));
    }
    std::memcpy(addr.sun_path, opts_.listen_path.data(), opts_.listen_path.size());
    struct stat st {};
    if (::lstat(opts_.listen_path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::FailedPreconditionError(fmt::format(
            "agent init: {} exists and is not a socket", opts_.listen_path));
      }
      ::unlink(opts_.listen_path.c_str());  // a stale socket from an earlier agent
    }
    listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!listen_fd_) return ErrnoStatus(errno, "agent init: socket(AF_UNIX)");
    const mode_t old_umask = ::umask(0077);
    const int rc = ::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    const int bind_errno = errno;
    ::umask(old_umask);
    if (rc != 0) {
      return ErrnoStatus(bind_errno, fmt::format("agent init: bind({})", opts_.listen_path));
    }
    bound_path_ = true;
    if (::listen(listen_fd_.get(), SOMAXCONN) != 0) {
      return ErrnoStatus(errno, fmt::format("agent init: listen({})", opts_.listen_path));
    }
  }
  ::fcntl(listen_fd_.get(), F_SETFD, FD_CLOEXEC);
  ::fcntl(listen_fd_.get(), F_SETFL, ::fcntl(listen_fd_.get(), F_GETFL) | O_NONBLOCK);
  if (AddWatch(listen_fd_.get(), EPOLLIN, {Kind::kListen}) == 0) {
    return absl::InternalError("agent init: cannot watch the listening socket");
  }
  return absl::OkStatus();
}

int Agent::Run() {
  Log("info", fmt::format("ready (pid {}, buffer {} bytes per stream)", ::getpid(), opts_.buffer_bytes));
  epoll_event events[64];
  while (!stop_) {
    // The loop's own timeout: a listening socket paused after EMFILE is retried after 100 ms
    // (session timeouts are timerfds in the epoll set).
    int timeout = -1;
    if (listen_paused_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          listen_resume_at_ - std::chrono::steady_clock::now());
      timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    int n = ::epoll_wait(epoll_.get(), events, 64, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      Log("error", fmt::format("epoll_wait: {}", ErrnoMessage(errno)));
      return 1;
    }
    if (listen_paused_ && std::chrono::steady_clock::now() >= listen_resume_at_) {
      listen_paused_ = false;
      epoll_event ev{};
      ev.events = EPOLLIN;
      for (auto& [token, w] : watches_) {
        if (w.kind == Kind::kListen) ev.data.u64 = token;
      }
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
    }
    for (int i = 0; i < n && !stop_; ++i) {
      // A handler earlier in this batch may have closed the target: look it up again.
      auto it = watches_.find(events[i].data.u64);
      if (it == watches_.end()) continue;
      const Watch w = it->second;
      switch (w.kind) {
        case Kind::kListen:
          OnListen();
          break;
        case Kind::kSignal:
          OnSignal();
          break;
        case Kind::kConn: {
          auto c = conns_.find(w.conn_id);
          if (c == conns_.end()) break;
          if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
            OnConnReadable(*c->second);
          }
          c = conns_.find(w.conn_id);
          if (c != conns_.end() && (events[i].events & EPOLLOUT)) Pump(*c->second);
          break;
        }
        case Kind::kStdin:
          FlushStdin(*w.session);
          break;
        case Kind::kTimer:
          OnTimer(*w.session);
          break;
        case Kind::kPipe:
          OnPipe(*w.session, w.stream_index);
          break;
      }
    }
  }
  Shutdown();
  return 0;
}

void Agent::OnListen() {
  for (int i = 0; i < 64; ++i) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Level-triggered epoll would spin on the pending connection: back off a little.
        Log("warn", fmt::format("accept: {}; pausing for 100 ms", ErrnoMessage(errno)));
        epoll_event ev{};
        ev.events = 0;
        for (auto& [token, w] : watches_) {
          if (w.kind == Kind::kListen) ev.data.u64 = token;
        }
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
        listen_paused_ = true;
        listen_resume_at_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        Log("warn", fmt::format("accept: {}", ErrnoMessage(errno)));
      }
      return;
    }
    if (conns_.size() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->id = next_conn_id_++;
    c->fd.Reset(fd);
    Watch w{Kind::kConn};
    w.conn_id = c->id;
    c->token = AddWatch(fd, EPOLLIN | EPOLLRDHUP, w);
    if (c->token == 0) continue;  // closes fd
    conns_[c->id] = std::move(c);
  }
}

void Agent::OnSignal() {
  signalfd_siginfo info[16];
  bool reap = false;
  for (;;) {
    ssize_t n = ::read(signal_fd_.get(), info, sizeof(info));
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (n <= 0) break;
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(info[0]); ++i) {
      if (info[i].ssi_signo == SIGCHLD) {
        reap = true;
      } else if (info[i].ssi_signo == SIGTERM || info[i].ssi_signo == SIGINT) {
        Log("info", fmt::format("received signal {}, shutting down", info[i].ssi_signo));
        stop_ = true;
      }
    }
  }
  // SIGCHLDs coalesce: one notification may stand for many exits.
  if (reap) Reap();
}

void Agent::Reap() {
  for (;;) {
    // Peek first (WNOWAIT): while the leader is an unreaped zombie its pid, which is also the
    // session's process group id, cannot be reused, so the group can still be killed safely.
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      return;
    }
    const pid_t pid = info.si_pid;
    if (pid <= 0) return;
    auto it = by_pid_.find(pid);
    Session* s = it == by_pid_.end() ? nullptr : it->second;
    if (s && oom_fd_ && info.si_code == CLD_KILLED && info.si_status == SIGKILL) {
      const std::optional<uint64_t> now = ReadOomKillCount(oom_fd_.get());
      if (now && *now > s->oom_kills_at_start) {
        s->oom_killed = true;
        // oom.group semantics for the session: what is left of it would run on half-broken.
        ::kill(-pid, SIGKILL);
      }
    }
    int status = 0;
    pid_t reaped;
    do {
      reaped = ::waitpid(pid, &status, WNOHANG);
    } while (reaped < 0 && errno == EINTR);
    if (reaped != pid) return;  // cannot happen: waitid just reported it
    file_workers_.erase(pid);
    if (!s) continue;  // an orphan or a file worker: reaping is all it needs
    by_pid_.erase(it);
    OnSessionExit(*s, status);
  }
}

void Agent::OnSessionExit(Session& s, int status) {
  s.exited = true;
  s.wait_status = status;
  s.exited_at = NowRfc3339();
  // Whatever the process wrote before it exited is already in the pipes: take it all, budget
  // or not, so the exit event really is last. Grandchildren still holding the write ends may
  // keep writing; DrainPipe stops at the pipe's capacity so they cannot delay the exit event.
  DrainPipe(s, 0);
  DrainPipe(s, 1);
  CloseStdin(s);
  DelWatch(s.timer_fd.get(), s.timer_token);
  s.timer_fd.Reset();
  protocol::ExitEvent ev;
  ev.timed_out = s.timed_out;
  if (WIFEXITED(status)) {
    ev.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    ev.signal = protocol::SignalName(sig).value_or(fmt::format("SIG{}", sig));
  }
  ev.oom_killed = s.oom_killed;
  const uint64_t id = s.log.AppendExit(ev);
  Log("info",
      fmt::format("session {} pid {} exited ({}{}{}), exit event {}", s.id, s.pid,
                  ev.exit_code ? fmt::format("code {}", *ev.exit_code) : *ev.signal,
                  ev.oom_killed ? ", OOM-killed" : "", ev.timed_out ? ", timed out" : "", id),
      s.id);
  PumpSession(s);
}

void Agent::DrainPipe(Session& s, int idx) {
  if (!s.pipe_fd[idx]) return;
  const Stream stream = idx == 0 ? Stream::kStdout : Stream::kStderr;
  int capacity = ::fcntl(s.pipe_fd[idx].get(), F_GETPIPE_SZ);
  size_t left = capacity > 0 ? static_cast<size_t>(capacity) : 1u << 20;
  while (left > 0) {
    ssize_t n = ::read(s.pipe_fd[idx].get(), read_buf_, std::min(left, sizeof(read_buf_)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.log.AppendOutput(stream, std::string_view(read_buf_, static_cast<size_t>(n)));
    left -= static_cast<size_t>(n);
  }
  ClosePipe(s, idx);
}

void Agent::ClosePipe(Session& s, int idx) {
  DelWatch(s.pipe_fd[idx].get(), s.pipe_token[idx]);
  s.pipe_fd[idx].Reset();
}

void Agent::PausePipe(Session& s, int idx) { DelWatch(s.pipe_fd[idx].get(), s.pipe_token[idx]); }

void Agent::ResumePipes(Session& s) {
  for (int idx = 0; idx < 2; ++idx) {
    const Stream stream = idx == 0 ? Stream::kStdout : Stream::kStderr;
    if (s.pipe_fd[idx] && s.pipe_token[idx] == 0 && s.log.CanRead(stream)) {
      Watch w{Kind::kPipe};
      w.session = &s;
      w.stream_index = idx;
      s.pipe_token[idx] = AddWatch(s.pipe_fd[idx].get(), EPOLLIN, w);
    }
  }
}

void Agent::OnPipe(Session& s, int idx) {
  const Stream stream = idx == 0 ? Stream::kStdout : Stream::kStderr;
  bool appended = false;
  for (int i = 0; i < kReadsPerWakeup && s.pipe_fd[idx]; ++i) {
    if (!s.log.CanRead(stream)) {
      PausePipe(s, idx);
      break;
    }
    ssize_t n = ::read(s.pipe_fd[idx].get(), read_buf_, sizeof(read_buf_));
    if (n > 0) {
      s.log.AppendOutput(stream, std::string_view(read_buf_, static_cast<size_t>(n)));
      appended = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EIO is how a pty master says that every slave fd is closed: the tty's EOF.
    if (n < 0 && !(s.tty && errno == EIO)) {
      Log("warn", fmt::format("session {}: read pipe: {}", s.id, ErrnoMessage(errno)), s.id);
    }
    ClosePipe(s, idx);  // EOF: every writer is gone
  }
  if (appended) PumpSession(s);
  // The pump may have freed room for a pipe paused above.
  if (s.pipe_fd[idx] && s.pipe_token[idx] == 0) ResumePipes(s);
}

void Agent::OnConnReadable(Connection& c) {
  const uint64_t id = c.id;
  for (int i = 0; i < kReadsPerWakeup; ++i) {
    ssize_t n = ::recv(c.fd.get(), read_buf_, sizeof(read_buf_), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      CloseConn(id);
      return;
    }
    if (n == 0) {  // the client went away; its session keeps running
      CloseConn(id);
      return;
    }
    if (c.frames_seen >= 2) continue;  // nothing is expected after the request (yet)
    c.decoder.Feed(std::string_view(read_buf_, static_cast<size_t>(n)));
    while (c.frames_seen < 2) {
      auto next = c.decoder.Next();
      if (!next.ok()) {
        Log("warn", fmt::format("connection {}: {}; closing it", id, std::string(next.status().message())));
        CloseConn(id);
        return;
      }
      if (!next->has_value()) break;
      HandleFrame(c, std::move(**next));
      if (conns_.find(id) == conns_.end()) return;
    }
  }
}

void Agent::HandleFrame(Connection& c, protocol::Frame frame) {
  const int expected_index = c.frames_seen++;
  if (expected_index == 0) {
    if (frame.type != FrameType::kHello) {
      Log("warn", fmt::format("connection {}: first frame has type {}, not hello; closing it", c.id,
                      static_cast<int>(frame.type)));
      CloseConn(c.id);
    }
    return;
  }
  if (frame.type != FrameType::kRequest) {
    Log("warn", fmt::format("connection {}: second frame has type {}, not request; closing it", c.id,
                    static_cast<int>(frame.type)));
    CloseConn(c.id);
    return;
  }
  // Release the request's buffer; bytes already read past the request (a file upload's first
  // frames) go to the request's handler.
  protocol::FrameDecoder rest = std::move(c.decoder);
  c.decoder = protocol::FrameDecoder();
  HandleRequest(c, frame.payload, rest);
}

void Agent::HandleRequest(Connection& c, const std::string& payload, protocol::FrameDecoder& rest) {
  Json resp;
  std::string resp_text;  // a payload serialized by its handler; else Dump(resp)
  bool streaming = false;
  try {
    // Depth-checked before a tree exists, like every payload that crosses the socket: then
    // nothing done with the request later (a copy, a dump, a comparison) recurses unbounded.
    auto parsed = protocol::ParseObjectPayload(payload, "request");
    Json req = parsed.ok() ? std::move(*parsed) : Json();
    if (!parsed.ok()) {
      resp = ErrorJson(parsed.status());
    } else if (auto op = req.find("op"); op == req.end() || !op->is_string()) {
      resp = ErrorJson(absl::InvalidArgumentError("request has no string \"op\""));
    } else if (*op == "ping") {
      resp = Json{{"ok", true}};
    } else if (*op == "attach") {
      resp = HandleAttach(c, req, streaming);
    } else if (*op == "status") {
      resp = HandleStatus(req);
    } else if (*op == "signal") {
      resp = HandleSignal(req);
    } else if (*op == "stdin") {
      resp = HandleStdin(req, /*close=*/false);
    } else if (*op == "stdin_close") {
      resp = HandleStdin(req, /*close=*/true);
    } else if (*op == "resize") {
      resp = HandleResize(req);
    } else if (*op == "processes") {
      resp_text = HandleProcesses();
    } else if (IsFileOp(op->get<std::string>())) {
      if (file_workers_.size() < kMaxFileWorkers) {
        ForkFileWorker(c, req, rest);
        return;
      }
      resp = ErrorJson(absl::UnavailableError(
          fmt::format("{} file transfers in progress; retry later", kMaxFileWorkers)));
    } else {
      resp = ErrorJson(absl::InvalidArgumentError(
          fmt::format("unknown op \"{}\"", op->get<std::string>())));
    }
  } catch (const std::exception& e) {
    streaming = false;
    resp_text.clear();
    resp = ErrorJson(absl::InternalError(fmt::format("request failed: {}", e.what())));
  }
  c.out += EncodeFrame(FrameType::kHello, Dump(Json{{"version", protocol::kVersion},
                                                    {"role", "agent"}}));
  c.out += EncodeFrame(FrameType::kResponse, resp_text.empty() ? Dump(resp) : resp_text);
  if (!streaming) c.close_after_flush = true;
  Pump(c);
}

void Agent::ForkFileWorker(Connection& c, const Json& req, protocol::FrameDecoder& rest) {
  const uint64_t id = c.id;
  const pid_t pid = ::fork();
  if (pid < 0) {
    Log("warn", fmt::format("connection {}: fork a file worker: {}", id, ErrnoMessage(errno)));
    CloseConn(id);  // the host sees the connection close and reports the agent unavailable
    return;
  }
  if (pid > 0) {
    file_workers_[pid] = true;
    CloseConn(id);  // the worker has its own copy of the socket
    return;
  }
  // Worker child: keep only the connection, the root and the log; the loop's fds (other
  // connections, pipes, the listening socket) must not stay open here, or their peers would
  // not see them close.
  std::vector<int> sorted = {c.fd.get(), root_fd_.get(), opts_.log_fd};
  const SandboxIdentity& identity = opts_.identity;
  if (identity.userns_fd >= 0) sorted.push_back(identity.userns_fd);
  for (int fd : identity.cgroup_procs_fds) sorted.push_back(fd);
  std::sort(sorted.begin(), sorted.end());
  unsigned lo = 3;
  for (int k : sorted) {
    if (k < static_cast<int>(lo)) continue;
    if (static_cast<unsigned>(k) > lo) ::close_range(lo, static_cast<unsigned>(k) - 1, 0);
    lo = static_cast<unsigned>(k) + 1;
  }
  ::close_range(lo, ~0U, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGTERM, SIG_DFL);
  ::fcntl(c.fd.get(), F_SETFL, ::fcntl(c.fd.get(), F_GETFL) & ~O_NONBLOCK);
  // File operations run as sandbox root, charged to the sandbox's cgroups: what they write is
  // the sandbox's, and their permission checks are sandbox root's.
  if (identity.userns_fd >= 0 || !identity.cgroup_procs_fds.empty()) {
    const char* step = "enter the sandbox";
    if (int err = EnterSandbox(identity, /*switch_user=*/false, 0, 0, nullptr, 0, &step); err != 0) {
      Log("error", fmt::format("connection {}: file worker: {}: {}", id, step, ErrnoMessage(err)));
      ::_exit(1);
    }
  }
  if (identity.userns_fd >= 0) ::close(identity.userns_fd);
  for (int fd : identity.cgroup_procs_fds) ::close(fd);
  FileOptions fo;
  fo.root_fd = root_fd_.get();
  fo.root_path = opts_.root;
  fo.workdir = opts_.workdir;
  ServeFileRequest(c.fd.get(), req, std::move(rest), fo);
  ::_exit(0);
}

absl::StatusOr<Session*> Agent::StartSession(const std::string& id, const Json& spec) {
  if (!spec.is_object()) {
    return absl::InvalidArgumentError("spec must be an object");
  }
  SpawnSpec ss;
  auto argv = spec.find("argv");
  if (argv == spec.end() || !argv->is_array() || argv->empty()) {
    return absl::InvalidArgumentError("spec.argv must be a non-empty array of strings");
  }
  for (const auto& a : *argv) {
    if (!a.is_string() || HasNul(a.get_ref<const std::string&>())) {
      return absl::InvalidArgumentError("spec.argv must hold strings without NUL bytes");
    }
    ss.argv.push_back(a.get<std::string>());
  }
  if (ss.argv[0].empty()) return absl::InvalidArgumentError("spec.argv[0] is empty");
  if (auto cwd = spec.find("cwd"); cwd != spec.end() && !cwd->is_null()) {
    if (!cwd->is_string() || HasNul(cwd->get_ref<const std::string&>())) {
      return absl::InvalidArgumentError("spec.cwd must be a string");
    }
    // SpawnSpec's default "/" stays for an empty cwd.
    if (!cwd->get_ref<const std::string&>().empty()) ss.cwd = cwd->get<std::string>();
  }
  std::map<std::string, std::string> env;
  if (auto e = spec.find("env"); e != spec.end() && !e->is_null()) {
    if (!e->is_object()) return absl::InvalidArgumentError("spec.env must be an object");
    for (const auto& [k, v] : e->items()) {
      if (k.empty() || k.find('=') != std::string::npos || HasNul(k) || !v.is_string() ||
          HasNul(v.get_ref<const std::string&>())) {
        return absl::InvalidArgumentError(fmt::format(
            "spec.env[\"{}\"]: keys must be non-empty without '=' and values strings", k));
      }
      env[k] = v.get<std::string>();
    }
  }
  // Interactive options (see protocol.h). "tty" is true or {"rows","cols"}.
  if (auto t = spec.find("tty"); t != spec.end() && !t->is_null()) {
    if (t->is_boolean()) {
      ss.tty = t->get<bool>();
    } else if (t->is_object()) {
      ss.tty = true;
      for (const char* key : {"rows", "cols"}) {
        auto v = t->find(key);
        if (v == t->end()) continue;
        if (!v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > 65535) {
          return absl::InvalidArgumentError(
              fmt::format("spec.tty.{} must be an integer from 1 to 65535", key));
        }
        (std::string_view(key) == "rows" ? ss.rows : ss.cols) =
            static_cast<unsigned short>(v->get<uint64_t>());
      }
    } else {
      return absl::InvalidArgumentError("spec.tty must be a boolean or {\"rows\",\"cols\"}");
    }
  }
  if (auto in = spec.find("stdin"); in != spec.end() && !in->is_null()) {
    if (!in->is_boolean()) return absl::InvalidArgumentError("spec.stdin must be a boolean");
    ss.stdin_pipe = in->get<bool>();
  }
  int64_t timeout_s = 0;
  if (auto t = spec.find("timeout_s"); t != spec.end() && !t->is_null()) {
    if (!t->is_number_unsigned() || t->get<uint64_t>() < 1 ||
        t->get<uint64_t>() > static_cast<uint64_t>(kMaxTimeoutS)) {
      return absl::InvalidArgumentError(
          fmt::format("spec.timeout_s must be an integer from 1 to {}", kMaxTimeoutS));
    }
    timeout_s = t->get<int64_t>();
  }
  int kill_grace_s = kDefaultKillGraceS;
  if (auto g = spec.find("kill_grace_s"); g != spec.end() && !g->is_null()) {
    if (!g->is_number_unsigned() || g->get<uint64_t>() > kMaxKillGraceS) {
      return absl::InvalidArgumentError(
          fmt::format("spec.kill_grace_s must be an integer from 0 to {}", kMaxKillGraceS));
    }
    kill_grace_s = g->get<int>();
  }
  // Terminal programs need TERM to draw; the caller's env wins.
  if (ss.tty && !env.count("TERM")) env["TERM"] = "xterm-256color";
  ss.env = BuildEnv(environ, env);
  if (auto u = spec.find("user"); u != spec.end() && !u->is_null()) {
    if (!u->is_string()) return absl::InvalidArgumentError("spec.user must be a string");
    const std::string user = u->get<std::string>();
    if (!user.empty() && opts_.switch_user) {
      SBX_ASSIGN_OR_RETURN(ResolvedUser ru, ResolveUserFromFiles(user));
      ss.user = std::move(ru);
    }
  }

  // Read before the fork, so that a kill right after exec is seen as growth.
  const uint64_t oom_before = oom_fd_ ? ReadOomKillCount(oom_fd_.get()).value_or(0) : 0;
  if (opts_.identity.userns_fd >= 0 || !opts_.identity.cgroup_procs_fds.empty()) ss.identity = &opts_.identity;
  SBX_ASSIGN_OR_RETURN(SpawnedProcess p, Spawn(ss));
  auto s = std::make_unique<Session>(opts_.buffer_bytes);
  s->oom_kills_at_start = oom_before;
  s->id = id;
  s->pid = p.pid;
  s->started_at = NowRfc3339();
  s->pipe_fd[0] = std::move(p.stdout_fd);
  s->pipe_fd[1] = std::move(p.stderr_fd);
  s->tty = ss.tty;
  s->stdin_enabled = ss.tty || ss.stdin_pipe;
  s->stdin_fd = std::move(p.stdin_fd);
  s->kill_grace_s = kill_grace_s;
  Session* raw = s.get();
  sessions_[id] = std::move(s);
  by_pid_[raw->pid] = raw;
  ResumePipes(*raw);
  if (timeout_s > 0) {
    // A timerfd in the loop: the deadline holds with no client attached and whatever sbxd
    // does meanwhile (it may restart; the agent does not).
    raw->timer_fd.Reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!raw->timer_fd) {
      const int err = errno;
      ::kill(-raw->pid, SIGKILL);  // reaped and reported as an exit like any other
      return ErrnoStatus(err, fmt::format("session {}: timerfd_create", id));
    }
    ArmTimer(*raw, timeout_s);
    Watch w{Kind::kTimer};
    w.session = raw;
    raw->timer_token = AddWatch(raw->timer_fd.get(), EPOLLIN, w);
  }
  // argv[0] only: the rest of argv and the environment may carry the caller's secrets.
  Log("info", fmt::format("session {} started pid {}: {}", id, raw->pid, ss.argv[0]), id);
  return raw;
}

Json Agent::HandleAttach(Connection& c, const Json& req, bool& streaming) {
  auto sid = req.find("session_id");
  if (sid == req.end() || !sid->is_string() || sid->get_ref<const std::string&>().empty() ||
      sid->get_ref<const std::string&>().size() > kMaxSessionIdLength) {
    return ErrorJson(absl::InvalidArgumentError("attach: session_id must be a non-empty string"));
  }
  const std::string id = sid->get<std::string>();
  uint64_t after = 0;
  if (auto a = req.find("after_event_id"); a != req.end() && !a->is_null()) {
    if (!a->is_number_unsigned()) {
      return ErrorJson(
          absl::InvalidArgumentError("attach: after_event_id must be a non-negative integer"));
    }
    after = a->get<uint64_t>();
  }

  bool started = false;
  Session* s = nullptr;
  if (auto it = sessions_.find(id); it != sessions_.end()) {
    s = it->second.get();
  } else {
    auto spec = req.find("spec");
    if (spec == req.end() || spec->is_null()) {
      return ErrorJson(absl::NotFoundError(
          fmt::format("unknown session \"{}\" (its first attach needs a spec)", id)));
    }
    auto r = StartSession(id, *spec);
    if (!r.ok()) {
      return ErrorJson(absl::Status(r.status().code(),
                                    fmt::format("attach {}: {}", id,
                                                std::string(r.status().message()))));
    }
    s = *r;
    started = true;
  }

  c.session = s;
  c.cursor = after == UINT64_MAX ? after : after + 1;
  s->conns.push_back(c.id);
  streaming = true;
  return Json{{"ok", true}, {"started", started}, {"pid", s->pid}};
}

Json Agent::HandleStatus(const Json& req) {
  auto sid = req.find("session_id");
  if (sid == req.end() || !sid->is_string()) {
    return ErrorJson(absl::InvalidArgumentError("status: session_id must be a string"));
  }
  Json r = {{"ok", true},         {"state", "unknown"},    {"pid", nullptr},
            {"exit_code", nullptr}, {"signal", nullptr},   {"started_at", nullptr},
            {"exited_at", nullptr}, {"oom_killed", false}, {"timed_out", false}};
  auto it = sessions_.find(sid->get<std::string>());
  if (it == sessions_.end()) return r;
  const Session& s = *it->second;
  r["state"] = s.exited ? "exited" : "running";
  r["pid"] = s.pid;
  r["started_at"] = s.started_at;
  r["timed_out"] = s.timed_out;
  r["tty"] = s.tty;
  r["stdin"] = s.stdin_enabled;
  if (s.exited) {
    r["exited_at"] = s.exited_at;
    r["oom_killed"] = s.oom_killed;
    if (WIFEXITED(s.wait_status)) {
      r["exit_code"] = WEXITSTATUS(s.wait_status);
    } else if (WIFSIGNALED(s.wait_status)) {
      const int sig = WTERMSIG(s.wait_status);
      r["signal"] = protocol::SignalName(sig).value_or(fmt::format("SIG{}", sig));
    }
  }
  return r;
}

Json Agent::HandleSignal(const Json& req) {
  auto sid = req.find("session_id");
  if (sid == req.end() || !sid->is_string()) {
    return ErrorJson(absl::InvalidArgumentError("signal: session_id must be a string"));
  }
  int sig = 0;
  auto sj = req.find("signal");
  if (sj != req.end() && sj->is_number_integer()) {
    const int64_t v = sj->get<int64_t>();
    if (v >= 1 && v <= SIGRTMAX) sig = static_cast<int>(v);
  } else if (sj != req.end() && sj->is_string()) {
    sig = protocol::SignalNumber(sj->get<std::string>()).value_or(0);
  }
  if (sig == 0) {
    return ErrorJson(absl::InvalidArgumentError(
        "signal: \"signal\" must be a signal number (1-64) or name"));
  }
  auto it = sessions_.find(sid->get<std::string>());
  if (it == sessions_.end()) {
    return ErrorJson(absl::NotFoundError(
        fmt::format("signal: unknown session \"{}\"", sid->get<std::string>())));
  }
  const Session& s = *it->second;
  // Once the leader is reaped its pid (= the group id) may be reused, outside a pid namespace
  // even by an unrelated process: never signal a group after the leader's exit.
  if (s.exited) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("signal: session \"{}\" has exited", s.id)));
  }
  if (::kill(-s.pid, sig) != 0) {
    return ErrorJson(ErrnoStatus(errno, fmt::format("signal: kill(-{}, {})", s.pid, sig)));
  }
  return Json{{"ok", true}};
}

absl::StatusOr<Session*> Agent::FindSession(const Json& req, std::string_view op) {
  auto sid = req.find("session_id");
  if (sid == req.end() || !sid->is_string()) {
    return absl::InvalidArgumentError(fmt::format("{}: session_id must be a string", op));
  }
  auto it = sessions_.find(sid->get<std::string>());
  if (it == sessions_.end()) {
    return absl::NotFoundError(
        fmt::format("{}: unknown session \"{}\"", op, sid->get<std::string>()));
  }
  return it->second.get();
}

Json Agent::HandleStdin(const Json& req, bool close) {
  const std::string_view op = close ? "stdin_close" : "stdin";
  auto found = FindSession(req, op);
  if (!found.ok()) return ErrorJson(found.status());
  Session& s = **found;
  std::string data;
  if (!close) {
    auto d = req.find("data_b64");
    if (d == req.end() || !d->is_string()) {
      return ErrorJson(absl::InvalidArgumentError("stdin: data_b64 must be a base64 string"));
    }
    auto decoded = DecodeBase64(d->get_ref<const std::string&>());
    if (!decoded) return ErrorJson(absl::InvalidArgumentError("stdin: data_b64 is not base64"));
    data = std::move(*decoded);
  }
  if (!s.stdin_enabled) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("{}: session \"{}\" was started without stdin", op, s.id)));
  }
  if (s.exited) {
    return ErrorJson(
        absl::FailedPreconditionError(fmt::format("{}: session \"{}\" has exited", op, s.id)));
  }
  if (s.stdin_close_requested) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("{}: stdin of session \"{}\" is closed", op, s.id)));
  }
  if (!s.stdin_fd) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("{}: session \"{}\" no longer reads stdin ({})", op, s.id,
                    s.stdin_error.empty() ? "closed" : s.stdin_error)));
  }
  const size_t queued = s.stdin_buf.size() - s.stdin_off;
  if (close) {
    s.stdin_close_requested = true;
    // A terminal has no end of file to close: its line discipline turns VEOF (^D) at the
    // start of a line into one for the reader, which is what a shell or cat waits for.
    if (s.tty) s.stdin_buf += '\x04';
  } else {
    if (queued + data.size() > kMaxStdinQueue) {
      return ErrorJson(absl::ResourceExhaustedError(fmt::format(
          "stdin: session \"{}\" has {} bytes queued that its process has not read yet; "
          "{} more would exceed the {} byte buffer",
          s.id, queued, data.size(), kMaxStdinQueue)));
    }
    s.stdin_buf += data;
  }
  FlushStdin(s);
  return Json{{"ok", true}, {"queued", s.stdin_buf.size() - s.stdin_off}};
}

void Agent::FlushStdin(Session& s) {
  while (s.stdin_fd && s.stdin_off < s.stdin_buf.size()) {
    ssize_t n = ::write(s.stdin_fd.get(), s.stdin_buf.data() + s.stdin_off,
                        s.stdin_buf.size() - s.stdin_off);
    if (n > 0) {
      s.stdin_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (s.stdin_token == 0) {
        Watch w{Kind::kStdin};
        w.session = &s;
        s.stdin_token = AddWatch(s.stdin_fd.get(), EPOLLOUT, w);
      }
      return;
    }
    // EPIPE: the process closed its stdin (or exited); what is queued has no reader.
    s.stdin_error = fmt::format("write stdin: {}", ErrnoMessage(n < 0 ? errno : EIO));
    Log("info", fmt::format("session {}: {}; dropping {} queued bytes", s.id, s.stdin_error,
                            s.stdin_buf.size() - s.stdin_off),
        s.id);
    CloseStdin(s);
    return;
  }
  s.stdin_buf.clear();
  s.stdin_off = 0;
  if (s.stdin_fd) DelWatch(s.stdin_fd.get(), s.stdin_token);
  if (s.stdin_close_requested) CloseStdin(s);
}

void Agent::CloseStdin(Session& s) {
  if (s.stdin_fd) DelWatch(s.stdin_fd.get(), s.stdin_token);
  s.stdin_fd.Reset();  // the pipe's EOF; for a tty only our duplicate of the master
  s.stdin_buf.clear();
  s.stdin_buf.shrink_to_fit();
  s.stdin_off = 0;
}

void Agent::ArmTimer(Session& s, int64_t seconds) {
  itimerspec its{};
  its.it_value.tv_sec = seconds;
  // A zero it_value would disarm the timer: a zero grace period is "at once".
  if (seconds == 0) its.it_value.tv_nsec = 1;
  if (::timerfd_settime(s.timer_fd.get(), 0, &its, nullptr) != 0) {
    Log("error", fmt::format("session {}: timerfd_settime: {}", s.id, ErrnoMessage(errno)), s.id);
  }
}

void Agent::OnTimer(Session& s) {
  uint64_t expirations = 0;
  if (::read(s.timer_fd.get(), &expirations, sizeof(expirations)) < 0 && errno == EAGAIN) return;
  if (s.exited) return;
  if (!s.timed_out) {
    s.timed_out = true;
    Log("info", fmt::format("session {} timed out: SIGTERM to group {}, SIGKILL in {} s", s.id,
                            s.pid, s.kill_grace_s),
        s.id);
    ::kill(-s.pid, SIGTERM);
    ArmTimer(s, s.kill_grace_s);
    return;
  }
  if (!s.kill_sent) {
    s.kill_sent = true;
    Log("info", fmt::format("session {}: still running {} s after SIGTERM: SIGKILL", s.id,
                            s.kill_grace_s),
        s.id);
    ::kill(-s.pid, SIGKILL);
  }
  DelWatch(s.timer_fd.get(), s.timer_token);
  s.timer_fd.Reset();
}

Json Agent::HandleResize(const Json& req) {
  auto found = FindSession(req, "resize");
  if (!found.ok()) return ErrorJson(found.status());
  Session& s = **found;
  winsize ws{};
  for (const char* key : {"rows", "cols"}) {
    auto v = req.find(key);
    if (v == req.end() || !v->is_number_unsigned() || v->get<uint64_t>() < 1 ||
        v->get<uint64_t>() > 65535) {
      return ErrorJson(absl::InvalidArgumentError(
          fmt::format("resize: \"{}\" must be an integer from 1 to 65535", key)));
    }
    (std::string_view(key) == "rows" ? ws.ws_row : ws.ws_col) =
        static_cast<unsigned short>(v->get<uint64_t>());
  }
  if (!s.tty) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("resize: session \"{}\" has no terminal", s.id)));
  }
  if (s.exited) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("resize: session \"{}\" has exited", s.id)));
  }
  const int fd = s.pipe_fd[0] ? s.pipe_fd[0].get() : s.stdin_fd.get();
  if (fd < 0) {
    return ErrorJson(absl::FailedPreconditionError(
        fmt::format("resize: the terminal of session \"{}\" is closed", s.id)));
  }
  // The kernel sends SIGWINCH to the terminal's foreground process group.
  if (::ioctl(fd, TIOCSWINSZ, &ws) != 0) {
    return ErrorJson(ErrnoStatus(errno, fmt::format("resize: ioctl(TIOCSWINSZ) for {}", s.id)));
  }
  return Json{{"ok", true}};
}

namespace {

// The small fields of /proc/PID/stat and status, for every process: the first pass keeps
// only these, whatever the guest runs. argv is read per process as its entry is written.
struct ProcInfo {
  pid_t pid = 0, ppid = 0, pgrp = 0, sid = 0;
  char state = '?';
  uint64_t start_ticks = 0;
  uid_t uid = 0;
  std::string comm;
};

bool ReadSmallFile(const std::string& path, std::string& out, size_t max = 64 << 10) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  out.clear();
  char buf[4096];
  while (out.size() < max) {
    ssize_t n = ::read(fd.get(), buf, std::min(sizeof(buf), max - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return true;
}

std::optional<ProcInfo> ReadProc(pid_t pid, std::string& text) {
  ProcInfo p;
  p.pid = pid;
  if (!ReadSmallFile(fmt::format("/proc/{}/stat", pid), text)) return std::nullopt;
  // "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice threads itrealvalue starttime ...": comm may hold spaces
  // and parentheses, so parse after the last ')'.
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  p.comm = CutField(std::string_view(text).substr(open + 1, close - open - 1));
  int ppid = 0, pgrp = 0, sid = 0;
  unsigned long long start = 0;
  if (std::sscanf(text.c_str() + close + 1,
                  " %c %d %d %d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &p.state, &ppid, &pgrp, &sid, &start) != 5) {
    return std::nullopt;
  }
  p.ppid = ppid;
  p.pgrp = pgrp;
  p.sid = sid;
  p.start_ticks = start;
  if (ReadSmallFile(fmt::format("/proc/{}/status", pid), text)) {
    const size_t at = text.find("\nUid:");
    if (at != std::string::npos) {
      p.uid = static_cast<uid_t>(std::strtoul(text.c_str() + at + 5, nullptr, 10));
    }
  }
  return p;
}

// uid -> name from the sandbox's /etc/passwd (the agent is static: no NSS), for the uids in
// `wanted` only: the file is the guest's, and its size is not ours to hold in a map.
std::map<int64_t, std::string> PasswdNames(const std::set<int64_t>& wanted) {
  std::map<int64_t, std::string> out;
  std::string text;
  if (wanted.empty() || !ReadSmallFile("/etc/passwd", text, 1 << 20)) return out;
  size_t pos = 0;
  while (pos < text.size() && out.size() < wanted.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string uid_text(line.substr(c2 + 1, line.find(':', c2 + 1) - c2 - 1));
    char* e = nullptr;
    const unsigned long uid = std::strtoul(uid_text.c_str(), &e, 10);
    if (uid_text.empty() || *e != '\0' || !wanted.count(static_cast<int64_t>(uid))) continue;
    out.emplace(static_cast<int64_t>(uid), CutField(line.substr(0, c1)));
  }
  return out;
}

}  // namespace

std::string Agent::HandleProcesses() {
  std::vector<ProcInfo> all;
  std::string text;  // one buffer for every small /proc read
  DIR* d = ::opendir("/proc");
  if (!d) return Dump(ErrorJson(ErrnoStatus(errno, "processes: opendir(/proc)")));
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    if (auto p = ReadProc(static_cast<pid_t>(pid), text)) all.push_back(std::move(*p));
  }
  ::closedir(d);
  const pid_t self = ::getpid();
  // As PID 1 every process of the namespace is the sandbox's. Elsewhere (the fake runtime on
  // the host) only our descendants are.
  std::unordered_map<pid_t, pid_t> parent;
  for (const ProcInfo& p : all) parent[p.pid] = p.ppid;
  auto ours = [&](pid_t pid) {
    if (self == 1) return true;
    for (pid_t q = parent.count(pid) ? parent[pid] : 0, hops = 0; q > 0 && hops < 4096; ++hops) {
      if (q == self) return true;
      auto it = parent.find(q);
      q = it == parent.end() ? 0 : it->second;
    }
    return false;
  };
  std::erase_if(all, [&](const ProcInfo& p) { return p.pid == self || !ours(p.pid); });
  // A process belongs to the session whose leader's pid is its process group or session id:
  // both are inherited by children (unless they call setsid/setpgid themselves, then null).
  // A group id cannot be handed to a new process while the group exists, so an exited
  // session's leftovers are still attributed correctly; of sessions with the same leader pid
  // (reuse after the group died), the latest started wins.
  std::unordered_map<pid_t, const Session*> by_leader;
  for (const auto& [id, s] : sessions_) {
    auto [it, added] = by_leader.emplace(s->pid, s.get());
    if (!added && it->second->started_at < s->started_at) it->second = s.get();
  }
  long ticks = ::sysconf(_SC_CLK_TCK);
  if (ticks <= 0) ticks = 100;
  int64_t btime = 0;
  if (ReadSmallFile("/proc/stat", text, 1 << 20)) {
    const size_t at = text.find("\nbtime ");
    if (at != std::string::npos) btime = std::strtoll(text.c_str() + at + 7, nullptr, 10);
  }
  std::set<int64_t> uids;
  for (const ProcInfo& p : all) uids.insert(opts_.identity.ToSandboxId(p.uid));
  const auto names = PasswdNames(uids);
  // Entry by entry into text (bounded.h): a tree of every entry is what a guest with huge
  // argv used to grow the agent's memory with, and sbxd's after it.
  ListReply reply("processes", protocol::kMaxProcessEntries);
  for (const ProcInfo& p : all) {
    if (reply.full()) break;
    // Read now and never whole: a cmdline can be MiBs.
    BoundedArgv argv;
    if (UniqueFd fd(::open(fmt::format("/proc/{}/cmdline", p.pid).c_str(), O_RDONLY | O_CLOEXEC));
        fd) {
      argv = ReadArgv(fd.get());
    }
    const Session* s = nullptr;
    if (auto it = by_leader.find(p.pgrp); it != by_leader.end()) s = it->second;
    if (!s) {
      if (auto it = by_leader.find(p.sid); it != by_leader.end()) s = it->second;
    }
    const int64_t uid = opts_.identity.ToSandboxId(p.uid);
    auto name = names.find(uid);
    Json j = {{"pid", p.pid},
              {"ppid", p.ppid},
              {"pgid", p.pgrp},
              {"state", std::string(1, p.state)},
              {"comm", p.comm},
              {"argv", std::move(argv.args)},
              {"argv_truncated", argv.truncated},
              {"uid", uid},
              {"user", name == names.end() ? Json(nullptr) : Json(name->second)},
              {"started_at", nullptr},
              {"session_id", s ? Json(s->id) : Json(nullptr)}};
    if (btime > 0) {
      const int64_t ms = btime * 1000 + static_cast<int64_t>(p.start_ticks) * 1000 / ticks;
      const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
      j["started_at"] = FormatRfc3339(at);
    }
    reply.Add(j);
  }
  return reply.Finish();
}

void Agent::Refill(Connection& c) {
  if (!c.session || c.exit_queued) return;
  EventLog& log = c.session->log;
  if (c.cursor < log.oldest_id()) {
    // Events this connection has not seen were evicted (after an old after_event_id, or
    // because a faster connection let them go): say where the retained data starts.
    auto resync = log.ResyncFor(c.cursor - 1);
    if (resync) c.out += EncodeFrame(FrameType::kResync, protocol::EncodeResync(*resync));
    c.cursor = log.oldest_id();
  }
  while (c.out.size() - c.out_off < kOutBufferTarget) {
    const LogEvent* e = log.Get(c.cursor);
    if (!e) break;
    log.Seal(e->id);  // from now on its bytes are what every attach replays
    if (e->is_exit) {
      c.out += EncodeFrame(FrameType::kExit, protocol::EncodeExit(e->exit));
      c.exit_queued = true;
    } else {
      protocol::AppendOutputFrame(c.out, e->id, e->stream, e->offset, e->data);
    }
    c.out_last_id = e->id;
    ++c.cursor;
    if (c.exit_queued) break;
  }
}

void Agent::Pump(Connection& c) {
  const uint64_t id = c.id;
  for (;;) {
    if (c.out_off == c.out.size()) {
      c.out.clear();
      c.out_off = 0;
      Refill(c);
      if (c.out.empty()) {
        const bool done =
            c.close_after_flush || c.exit_queued ||
            (c.session && c.session->log.has_exit() && c.cursor > c.session->log.exit_id());
        if (done) {
          CloseConn(id);
        } else {
          UpdateConnEvents(c, false);
        }
        return;
      }
    }
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        UpdateConnEvents(c, true);
        return;
      }
      CloseConn(id);  // EPIPE/ECONNRESET: the client is gone
      return;
    }
    c.out_off += static_cast<size_t>(n);
    if (c.out_off == c.out.size() && c.out_last_id != 0 && c.session) {
      Session& s = *c.session;
      s.log.MarkDelivered(c.out_last_id);
      c.out_last_id = 0;
      OnDelivered(s);
    }
  }
}

void Agent::OnDelivered(Session& s) {
  ResumePipes(s);
  if (s.finished || !s.log.has_exit() || s.log.delivered() < s.log.exit_id()) return;
  // The host has had everything of this session. Its log stays for replays, but the agent
  // lives inside the sandbox's memory limit, so finished sessions share a total of twice the
  // per-stream budget; beyond it the oldest lose their output (a later attach then gets a
  // kResync straight to the exit event). Exit status and times are kept for good, so a
  // re-sent attach never restarts the command.
  s.finished = true;
  finished_.push_back(&s);
  size_t total = 0;
  for (Session* f : finished_) {
    total += f->log.retained_bytes(Stream::kStdout) + f->log.retained_bytes(Stream::kStderr);
  }
  for (Session* f : finished_) {
    if (total <= 2 * opts_.buffer_bytes) break;
    total -= f->log.DropDelivered();
  }
  // Keep the vector from growing with sessions that hold nothing any more.
  std::erase_if(finished_, [](Session* f) {
    return f->log.retained_bytes(Stream::kStdout) + f->log.retained_bytes(Stream::kStderr) == 0;
  });
}

void Agent::PumpSession(Session& s) {
  // Pump may close connections and so edit s.conns: iterate over a copy.
  const std::vector<uint64_t> ids = s.conns;
  for (uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Connection& c = *it->second;
    if (!c.want_out) Pump(c);  // a connection waiting for EPOLLOUT resumes from there
  }
}

void Agent::UpdateConnEvents(Connection& c, bool want_out) {
  if (c.want_out == want_out) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want_out ? uint32_t{EPOLLOUT} : 0u);
  ev.data.u64 = c.token;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  c.want_out = want_out;
}

void Agent::CloseConn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Connection& c = *it->second;
  if (c.session) {
    auto& v = c.session->conns;
    v.erase(std::remove(v.begin(), v.end(), id), v.end());
  }
  DelWatch(c.fd.get(), c.token);
  conns_.erase(it);  // closes the socket
}

// Pids of the live (non-zombie) processes descending from `root`, from /proc.
std::vector<pid_t> LiveDescendants(pid_t root) {
  std::unordered_map<pid_t, pid_t> parent;
  std::vector<pid_t> live;
  DIR* d = ::opendir("/proc");
  if (!d) return {};
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
    if (!fd) continue;
    char buf[512];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    buf[n] = '\0';
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the
    // last ')'.
    char* close = std::strrchr(buf, ')');
    if (!close) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(close + 1, " %c %d", &state, &ppid) != 2) continue;
    parent[static_cast<pid_t>(pid)] = ppid;
    if (state != 'Z' && state != 'X') live.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  std::vector<pid_t> out;
  for (pid_t p : live) {
    for (pid_t q = parent.count(p) ? parent[p] : 0, hops = 0; q > 0 && hops < 4096; ++hops) {
      if (q == root) {
        out.push_back(p);
        break;
      }
      auto it = parent.find(q);
      q = it == parent.end() ? 0 : it->second;
    }
  }
  return out;
}

void Agent::Shutdown() {
  for (auto& [id, s] : sessions_) {
    if (!s->exited) ::kill(-s->pid, SIGKILL);
  }
  // Leftovers of exited sessions (background jobs, double-forked daemons) are still our
  // descendants: as a subreaper or PID 1 every orphan is re-parented to us. Kill them too,
  // repeating while forks race with the scan, and reap until we have no child at all so that
  // no zombie is handed to the host's init.
  if (::getpid() != 1) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (;;) {
      std::vector<pid_t> left = LiveDescendants(::getpid());
      for (pid_t p : left) ::kill(p, SIGKILL);
      Reap();
      if (left.empty() && ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        Log("warn", "shutdown: descendants still present after 2 s");
        break;
      }
      ::usleep(1000);
    }
  }
  // As PID 1 our exit makes the kernel kill every process of the namespace.
  if (bound_path_) ::unlink(opts_.listen_path.c_str());
  Log("info", "stopped");
}

}  // namespace

int RunAgent(const AgentOptions& options) {
  Agent agent(options);
  if (auto s = agent.Init(); !s.ok()) {
    WriteLogLine(options, "error", std::string(s.message()), {});
    return 1;
  }
  return agent.Run();
}

}  // namespace sbx::agent
