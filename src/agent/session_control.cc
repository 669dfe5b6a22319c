// Session control: status, signals, stdin (queued, written as the process takes it), resize,
// and the timeout's SIGTERM then SIGKILL.
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "agent/loop.h"
#include "common/status_util.h"

namespace sbx::agent {

using protocol::Json;

Json Agent::HandleStatus(const Json& req) {
  auto sid = ParseSessionId(req, "status");
  if (!sid.ok()) return ErrorJson(sid.status());
  Json r = {{"ok", true},         {"state", "unknown"},    {"pid", nullptr},
            {"exit_code", nullptr}, {"signal", nullptr},   {"started_at", nullptr},
            {"exited_at", nullptr}, {"oom_killed", false}, {"timed_out", false}};
  auto it = sessions_.find(*sid);
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
  auto parsed = ParseSignalRequest(req);
  if (!parsed.ok()) return ErrorJson(parsed.status());
  const int sig = parsed->signal;
  auto it = sessions_.find(parsed->session_id);
  if (it == sessions_.end()) {
    return ErrorJson(absl::NotFoundError(
        fmt::format("signal: unknown session \"{}\"", parsed->session_id)));
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
  SBX_ASSIGN_OR_RETURN(std::string id, ParseSessionId(req, op));
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(fmt::format("{}: unknown session \"{}\"", op, id));
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
    auto decoded = ParseStdinData(req);
    if (!decoded.ok()) return ErrorJson(decoded.status());
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
  auto size = ParseResizeSize(req);
  if (!size.ok()) return ErrorJson(size.status());
  winsize ws{};
  ws.ws_row = size->rows;
  ws.ws_col = size->cols;
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

}  // namespace sbx::agent
