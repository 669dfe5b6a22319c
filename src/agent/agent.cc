// The event loop (agent.h): setup, dispatch of epoll events, connections and their request,
// file workers, reaping and shutdown. The rest of the loop's methods live in output.cc,
// session_start.cc, session_control.cc and processes.cc (loop.h lists them).
#include "agent/agent.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "agent/files.h"
#include "agent/loop.h"
#include "agent/oom.h"
#include "agent/procfs.h"
#include "agent/spawn.h"
#include "common/log_format.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "protocol/limits.h"

namespace sbx::agent {

using protocol::EncodeFrame;
using protocol::FrameType;
using protocol::Json;

void WriteLogLine(const AgentOptions& opts, std::string_view level, std::string_view msg,
                  std::string_view session) {
  const log::Field fields[] = {{"sandbox", opts.sandbox_id}, {"session", session}};
  const log::Attr attrs[] = {log::Attr("component", "sbx-agent")};
  std::string line;
  log::AppendRecord(line, log::Format::kJson,
                    log::Record{std::chrono::system_clock::now(), level, msg, fields, attrs});
  (void)!::write(opts.log_fd, line.data(), line.size());
}

Json ErrorJson(const absl::Status& s) {
  return Json{{"ok", false},
              {"error",
               {{"code", protocol::ErrorCodeName(s.code())},
                {"message", CutField(std::string(s.message()))}}}};
}

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
  // Output events are read straight into buffers of what the pipe held (up to kMaxEventBytes)
  // and freed as connections take them: with glibc's adaptive defaults (mmap above 128 KiB,
  // give the heap's top back above twice that) a busy stream returned and faulted in again
  // ~45 MiB of pages per GiB of output. The heap keeps up to 4 MiB free instead; an idle
  // agent never grows that far.
  ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(2 * kMaxEventBytes));
  ::mallopt(M_TRIM_THRESHOLD, 4 << 20);
  // Session processes inherit 0-2 only through dup2; keeping them open here guarantees that
  // pipe ends are >= 3.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int n = ::open("/dev/null", O_RDWR);  // inheritable: it becomes fd 0-2 of every process
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
  RecordSignalDispositions();  // what Spawn's children reset

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
  // The launcher's helper that detached the host's tree (PID 2, launcher.cc) may have exited
  // before SIGCHLD was blocked, when its signal was discarded: reap it now.
  Reap();

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

  SBX_RETURN_IF_ERROR(OpenListenSocket());
  ::fcntl(listen_fd_.get(), F_SETFD, FD_CLOEXEC);
  ::fcntl(listen_fd_.get(), F_SETFL, ::fcntl(listen_fd_.get(), F_GETFL) | O_NONBLOCK);
  if (AddWatch(listen_fd_.get(), EPOLLIN, {Kind::kListen}) == 0) {
    return absl::InternalError("agent init: cannot watch the listening socket");
  }
  return absl::OkStatus();
}

// The inherited listening socket (--listen-fd), or one bound at --listen.
absl::Status Agent::OpenListenSocket() {
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
  return absl::OkStatus();
}

int Agent::Run() {
  Log("info", fmt::format("ready (pid {}, buffer {} bytes per stream)", ::getpid(), opts_.buffer_bytes));
  epoll_event events[64];
  while (!stop_) {
    // The loop's own timeout: a listening socket paused after EMFILE is retried after 100 ms,
    // a moderated pipe is read again when due (session timeouts are timerfds in the epoll set).
    // Microseconds matter for the pipes: epoll_pwait2, or epoll_wait rounded up to 1 ms on a
    // kernel before 5.11.
    std::optional<std::chrono::steady_clock::time_point> wake;
    if (listen_paused_) wake = listen_resume_at_;
    if (!deferred_.empty() && (!wake || deferred_.front().due < *wake)) wake = deferred_.front().due;
    int n;
    if (!wake) {
      n = ::epoll_wait(epoll_.get(), events, 64, -1);
    } else {
      const auto left = std::max<std::chrono::nanoseconds>(
          std::chrono::nanoseconds(0), *wake - std::chrono::steady_clock::now());
      const timespec ts{static_cast<time_t>(left.count() / 1'000'000'000),
                        static_cast<long>(left.count() % 1'000'000'000)};
      n = have_pwait2_ ? ::epoll_pwait2(epoll_.get(), events, 64, &ts, nullptr) : -1;
      // ENOSYS on kernels before 5.11; whatever else a filter might answer, epoll_wait then
      // says what is wrong, if anything.
      if (n < 0 && have_pwait2_ && errno != EINTR) have_pwait2_ = false;
      if (!have_pwait2_) {
        n = ::epoll_wait(epoll_.get(), events, 64,
                         static_cast<int>((left.count() + 999'999) / 1'000'000));
      }
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      Log("error", fmt::format("epoll_wait: {}", ErrnoMessage(errno)));
      return 1;
    }
    if (!deferred_.empty()) ResumeDuePipes(std::chrono::steady_clock::now());
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
  std::string resp_text;  // a payload serialized by its handler; else DumpJson(resp)
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
  c.out += EncodeFrame(FrameType::kHello, DumpJson(Json{{"version", protocol::kVersion},
                                                    {"role", "agent"}}));
  c.out += EncodeFrame(FrameType::kResponse, resp_text.empty() ? DumpJson(resp) : resp_text);
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
  if (opts_.upper_fd >= 0) sorted.push_back(opts_.upper_fd);
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
  fo.upper_fd = opts_.upper_fd;
  fo.spare_pids = opts_.spare_pids;
  ServeFileRequest(c.fd.get(), req, std::move(rest), fo);
  ::_exit(0);
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

int RunAgent(const AgentOptions& options) {
  Agent agent(options);
  if (auto s = agent.Init(); !s.ok()) {
    WriteLogLine(options, "error", std::string(s.message()), {});
    return 1;
  }
  return agent.Run();
}

}  // namespace sbx::agent
