// attach: a connection follows a session's events, starting the session on its first attach.
#include <signal.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>

#include <fmt/format.h>

#include "agent/loop.h"
#include "agent/oom.h"
#include "agent/spawn.h"
#include "agent/users.h"
#include "common/status_util.h"
#include "common/time_util.h"

extern char** environ;

namespace sbx::agent {

using protocol::Json;

absl::StatusOr<Session*> Agent::StartSession(const std::string& id, const Json& spec) {
  SBX_ASSIGN_OR_RETURN(SessionSpec parsed, ParseSessionSpec(spec));
  SpawnSpec& ss = parsed.spawn;
  std::map<std::string, std::string>& env = parsed.env;
  // Terminal programs need TERM to draw; the caller's env wins.
  if (ss.tty && !env.count("TERM")) env["TERM"] = "xterm-256color";
  ss.env = BuildEnv(environ, env);
  if (!parsed.user.empty() && opts_.switch_user) {
    SBX_ASSIGN_OR_RETURN(ResolvedUser ru, ResolveUserFromFiles(parsed.user));
    ss.user = std::move(ru);
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
  s->kill_grace_s = parsed.kill_grace_s;
  Session* raw = s.get();
  sessions_[id] = std::move(s);
  by_pid_[raw->pid] = raw;
  ResumePipes(*raw);
  if (parsed.timeout_s > 0) {
    // A timerfd in the loop: the deadline holds with no client attached and whatever sbxd
    // does meanwhile (it may restart; the agent does not).
    raw->timer_fd.Reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!raw->timer_fd) {
      const int err = errno;
      ::kill(-raw->pid, SIGKILL);  // reaped and reported as an exit like any other
      return ErrnoStatus(err, fmt::format("session {}: timerfd_create", id));
    }
    ArmTimer(*raw, parsed.timeout_s);
    Watch w{Kind::kTimer};
    w.session = raw;
    raw->timer_token = AddWatch(raw->timer_fd.get(), EPOLLIN, w);
  }
  // argv[0] only: the rest of argv and the environment may carry the caller's secrets.
  Log("info", fmt::format("session {} started pid {}: {}", id, raw->pid, ss.argv[0]), id);
  return raw;
}

Json Agent::HandleAttach(Connection& c, const Json& req, bool& streaming) {
  auto parsed = ParseAttachRequest(req);
  if (!parsed.ok()) return ErrorJson(parsed.status());
  const std::string& id = parsed->session_id;
  const uint64_t after = parsed->after_event_id;

  bool started = false;
  Session* s = nullptr;
  if (auto it = sessions_.find(id); it != sessions_.end()) {
    s = it->second.get();
  } else {
    if (parsed->spec == nullptr) {
      return ErrorJson(absl::NotFoundError(
          fmt::format("unknown session \"{}\" (its first attach needs a spec)", id)));
    }
    auto r = StartSession(id, *parsed->spec);
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

}  // namespace sbx::agent
