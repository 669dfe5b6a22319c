// exec and attach, and the attach-stream consumer shared with `run`.
#include <unistd.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli_common.h"
#include "cli/ws_session.h"
#include "common/base64.h"

namespace sbx::cli {
namespace {

constexpr int kMaxReconnects = 5;

// Output bookkeeping for one stream (stdout or stderr): the next byte offset we expect, so that
// a replay after reconnecting is not printed twice and a gap is reported instead of hidden.
struct StreamCursor {
  const char* name;
  int fd;
  uint64_t next = 0;
  bool known = true;  // false when resuming from an id whose offsets we never saw
};

struct StreamState {
  std::array<StreamCursor, 2> cursors{{{"stdout", STDOUT_FILENO}, {"stderr", STDERR_FILENO}}};
  std::string last_event_id;
  bool exited = false;
  int exit_code = kExitFailure;
  std::optional<absl::Status> stream_error;  // from an `error` event
  uint64_t events = 0;
};

// Lookups that never throw on a field of an unexpected type (nlohmann's value() would).
nlohmann::json Field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nlohmann::json() : *it;
}
bool BoolField(const nlohmann::json& j, const char* key) {
  nlohmann::json v = Field(j, key);
  return v.is_boolean() && v.get<bool>();
}

absl::StatusOr<nlohmann::json> ParseData(const AttachEvent& ev) {
  nlohmann::json j = ParseUntrustedJson(ev.data, kMaxResponseJsonDepth).value_or(nlohmann::json());
  if (!j.is_object()) {
    return absl::InternalError(fmt::format("attach: event {} ({}) has invalid JSON data",
                                           ev.id, ev.type));
  }
  return j;
}

// Output bytes that start at `off` in their stream: what was printed before a reconnect is
// not printed twice, and a gap is reported.
absl::Status WriteOutput(StreamCursor& cur, std::string_view out, uint64_t off) {
  const uint64_t end = off + out.size();
  if (cur.known && end <= cur.next) return absl::OkStatus();  // already printed
  if (cur.known && off < cur.next) {
    out.remove_prefix(cur.next - off);
  } else if (cur.known && off > cur.next) {
    PrintError(fmt::format("warning: {} bytes {}..{} were lost", cur.name, cur.next, off));
  }
  cur.next = end;
  cur.known = true;
  return WriteAll(cur.fd, out);
}

absl::Status HandleOutput(StreamState& st, StreamCursor& cur, const AttachEvent& ev) {
  if (ev.raw) return WriteOutput(cur, ev.data, ev.offset);
  auto data = ParseData(ev);
  if (!data.ok()) return data.status();
  std::string b64 = JsonString(*data, "data_b64");
  std::optional<std::string> bytes = sbx::Base64Decode(b64);
  if (!bytes) {
    return absl::InternalError(
        fmt::format("attach: event {} ({}) has invalid base64 data", ev.id, ev.type));
  }
  auto off_it = data->find("offset");
  if (off_it != data->end() && off_it->is_number_unsigned()) {
    return WriteOutput(cur, *bytes, off_it->get<uint64_t>());
  }
  return WriteAll(cur.fd, *bytes);
}

absl::StatusOr<bool> HandleEvent(StreamState& st, const AttachEvent& ev) {
  ++st.events;
  std::string previous_id = st.last_event_id;
  if (!ev.id.empty()) st.last_event_id = ev.id;
  if (ev.type == "stdout" || ev.type == "stderr") {
    StreamCursor& cur = st.cursors[ev.type == "stdout" ? 0 : 1];
    absl::Status s = HandleOutput(st, cur, ev);
    if (!s.ok()) return s;
    return true;
  }
  if (ev.type == "resync_required") {
    auto data = ParseData(ev);
    if (!data.ok()) return data.status();
    nlohmann::json oldest = Field(*data, "oldest_available_id");
    PrintError(fmt::format(
        "warning: output was lost: events after id {} and before id {} are no longer retained "
        "(resync_required); stdout resumes at byte {}, stderr at byte {}",
        previous_id.empty() ? "0" : previous_id,
        oldest.is_null() ? "?" : oldest.dump(), Field(*data, "stdout_offset").dump(),
        Field(*data, "stderr_offset").dump()));
    for (auto [i, key] : {std::pair{0, "stdout_offset"}, std::pair{1, "stderr_offset"}}) {
      auto it = data->find(key);
      if (it != data->end() && it->is_number_unsigned()) {
        uint64_t off = it->get<uint64_t>();
        if (!st.cursors[i].known || off > st.cursors[i].next) st.cursors[i].next = off;
        st.cursors[i].known = true;
      }
    }
    return true;
  }
  if (ev.type == "error") {
    auto data = ParseData(ev);
    std::string code = data.ok() ? JsonString(*data, "code") : "";
    std::string message = data.ok() ? JsonString(*data, "message") : ev.data;
    st.stream_error = absl::AbortedError(fmt::format(
        "attach: {}: {}", code.empty() ? "error" : code, message));
    return false;  // the server ends the stream after an error
  }
  if (ev.type == "process_exited") {
    auto data = ParseData(ev);
    if (!data.ok()) return data.status();
    st.exited = true;
    nlohmann::json code = Field(*data, "exit_code");
    nlohmann::json sig = Field(*data, "signal");
    bool timed_out = BoolField(*data, "timed_out");
    bool oom = BoolField(*data, "oom_killed");
    if (timed_out) PrintError("process was killed: its timeout expired");
    if (oom) PrintError("process was killed: out of memory");
    if (code.is_number_integer()) {
      st.exit_code = static_cast<int>(code.get<int64_t>() & 0xff);
    } else if (sig.is_string()) {
      int n = SignalNumber(sig.get<std::string>());
      if (!timed_out && !oom) {
        PrintError(fmt::format("process was killed by {}", sig.get<std::string>()));
      }
      st.exit_code = n > 0 ? 128 + n : kExitFailure;
    } else {
      PrintError("process exited without an exit code or signal");
      st.exit_code = kExitFailure;
    }
    return false;  // always the last event
  }
  // Unknown event types are skipped so that newer servers can add events.
  return true;
}

}  // namespace

absl::StatusOr<int> StreamSession(Client& client, AttachTarget& target) {
  StreamState st;
  st.last_event_id = target.last_event_id;
  if (!target.last_event_id.empty()) {
    for (auto& c : st.cursors) c.known = false;
  }
  StreamOptions opts;
  // The server hands out a path; anything else (an absolute URL) is not followed to another
  // host with our token, and the documented path is used instead.
  opts.target = !target.url.empty() && target.url.front() == '/'
                    ? target.url
                    : fmt::format("/v1/sessions/{}/attach", target.session_id);
  opts.token = target.token;
  int failures = 0;
  bool ever_connected = false;
  std::chrono::milliseconds backoff(100);
  for (;;) {
    // The first try is the create itself (`?attach=true`); once its stream has named the
    // session, a reconnect is a GET of that session's attach route with Last-Event-ID.
    const bool creating = target.session_id.empty() && !target.create_path.empty();
    if (creating) {
      opts.target = target.create_path + "?attach=true";
      opts.create_body = target.create_body;
      opts.idempotency_key = target.idempotency_key;
    }
    opts.last_event_id = st.last_event_id;
    uint64_t events_before = st.events;
    Client::StreamInfo info;
    absl::Status s = client.Stream(
        opts, [&](const AttachEvent& ev) { return HandleEvent(st, ev); }, &info);
    ever_connected = ever_connected || info.connected;
    if (creating && !info.session_id.empty()) {
      if (absl::Status bad = CheckId(info.session_id, "ses"); !bad.ok()) {
        return absl::InternalError(fmt::format("exec: sbxd returned {}", Msg(bad)));
      }
      target.session_id = info.session_id;
      opts.target = fmt::format("/v1/sessions/{}/attach", target.session_id);
      opts.create_body.clear();
      opts.idempotency_key.clear();
      client.set_second_signal_note(fmt::format(
          "session {} keeps running; reattach with: sbx attach {}", target.session_id,
          target.session_id));
    }
    if (creating && target.session_id.empty() && !s.ok()) {
      // No stream named a session: sbxd refused the create (4xx, 503), or the connection failed
      // before its answer, as a plain create's request would have. Not retried, as that was
      // not; the caller names what it was doing.
      return s;
    }
    if (st.exited) return st.exit_code;
    if (st.stream_error) return *st.stream_error;
    std::string why;
    if (s.ok()) {
      why = info.ended_mid_event ? "the stream ended in the middle of an event"
                                 : "the stream ended without process_exited";
    } else if (absl::IsCancelled(s)) {
      return s;
    } else if (!ever_connected) {
      // sbxd is not there at all: retrying would only repeat the same message.
      return s;
    } else if (absl::IsUnauthenticated(s) && !opts.token.empty()) {
      // The attach token expired: the management token may attach too.
      why = Msg(s);
      opts.token.clear();
    } else if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      why = Msg(s);
    } else {
      return absl::Status(s.code(), fmt::format("attach session {}: {}", target.session_id,
                                                Msg(s)));
    }
    if (st.events > events_before) {
      failures = 0;
      backoff = std::chrono::milliseconds(100);
    }
    if (++failures > kMaxReconnects) {
      return absl::UnavailableError(fmt::format(
          "attach session {}: {} (gave up after {} reconnects); no process_exited was received, "
          "so the process may still be running; resume with: sbx attach {}{}",
          target.session_id, why, kMaxReconnects, target.session_id,
          st.last_event_id.empty() ? "" : " --last-event-id " + st.last_event_id));
    }
    if (failures == 1) {
      PrintError(fmt::format("warning: {}; reconnecting{}", why,
                             st.last_event_id.empty() ? ""
                                                      : " after event " + st.last_event_id));
    }
    if (absl::Status slept = client.Sleep(backoff); !slept.ok()) return slept;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

namespace {

struct ExecOpts {
  std::string sandbox_id;
  std::vector<std::string> argv;
  std::string cwd;
  std::string user;
  std::vector<std::string> env;
  bool interactive = false;
  bool tty = false;
  int64_t timeout_s = 0;
};

// The POST /v1/sandboxes/{id}/sessions body for `sbx exec`; nullopt (with a usage error added)
// when the options do not make one.
std::optional<nlohmann::json> ExecBody(const ExecOpts& o, Context& ctx) {
  if (o.argv.empty()) {
    ctx.usage_errors.push_back({"exec: missing command (sbx exec SANDBOX -- CMD ARGS...)"});
    return std::nullopt;
  }
  if (absl::Status s = CheckId(o.sandbox_id, "sbx"); !s.ok()) {
    ctx.usage_errors.push_back({fmt::format("exec: {}", Msg(s))});
    return std::nullopt;
  }
  auto env = ParseKeyValues(o.env, "--env");
  if (!env.ok()) {
    ctx.usage_errors.push_back({Msg(env.status())});
    return std::nullopt;
  }
  nlohmann::json body = {{"argv", o.argv}};
  if (!env->empty()) body["env"] = *env;
  if (!o.cwd.empty()) body["cwd"] = o.cwd;
  if (!o.user.empty()) body["user"] = o.user;
  if (o.timeout_s > 0) body["timeout_s"] = o.timeout_s;
  if (o.tty) {
    auto size = TerminalSize(STDIN_FILENO);
    body["tty"] = size ? nlohmann::json{{"rows", std::min(size->first, 1000)},
                                        {"cols", std::min(size->second, 1000)}}
                       : nlohmann::json(true);
  }
  if (o.interactive) body["stdin"] = true;
  return body;
}

// Runs the command: over the WebSocket with -i/-t (after a plain create), else on the stream
// the create itself answers with (one request, `?attach=true`).
absl::StatusOr<int> RunExec(Client& client, const ExecOpts& o, const nlohmann::json& body) {
  const std::string path = fmt::format("/v1/sandboxes/{}/sessions", o.sandbox_id);
  AttachTarget t;
  if (o.interactive || o.tty) {
    auto res = client.Request("POST", path, &body, NewIdempotencyKey());
    if (!res.ok()) {
      return absl::Status(res.status().code(), fmt::format("exec: {}", Msg(res.status())));
    }
    t.session_id = JsonString(res->body, "session_id");
    if (absl::Status s = CheckId(t.session_id, "ses"); !s.ok()) {
      return absl::InternalError(fmt::format("exec: sbxd returned {}", Msg(s)));
    }
    if (res->body.contains("attach") && res->body["attach"].is_object()) {
      t.token = JsonString(res->body["attach"], "token");
    }
    // stdin and the terminal need the WebSocket; the attach token is enough for it.
    return RunWebSocketSession(client.endpoint(), t.token.empty() ? client.token() : t.token,
                               t.session_id, o.tty);
  }
  t.create_path = path;
  t.create_body = body.dump();
  t.idempotency_key = NewIdempotencyKey();
  auto code = StreamSession(client, t);
  if (!code.ok() && absl::IsCancelled(code.status())) {
    if (t.session_id.empty()) {
      PrintError(fmt::format("interrupted before sbxd answered; the command may have started in "
                             "sandbox {}", o.sandbox_id));
    } else {
      PrintError(fmt::format(
          "interrupted; session {} keeps running in sandbox {}; reattach with: sbx attach {}",
          t.session_id, o.sandbox_id, t.session_id));
    }
    return 128 + client.interrupt_signal();
  }
  if (!code.ok() && t.session_id.empty()) {
    return absl::Status(code.status().code(), fmt::format("exec: {}", Msg(code.status())));
  }
  return code;
}

void RegisterExec(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<ExecOpts>();
  CLI::App* cmd = app.add_subcommand("exec", "Run a command in an existing sandbox");
  cmd->add_flag("-i,--interactive", o->interactive,
                "Send local stdin to the command (EOF closes its stdin)");
  cmd->add_flag("-t,--tty", o->tty,
                "Run the command on a terminal (implies -i); with a terminal here, it is put "
                "in raw mode until the command ends (Ctrl-C goes to the command) and window "
                "size changes follow");
  cmd->add_option("--timeout", o->timeout_s,
                  "Kill the command after this many seconds (SIGTERM, SIGKILL 5 s later)")
      ->check(CLI::Range(int64_t{1}, int64_t{30} * 86400));
  cmd->add_option("sandbox", o->sandbox_id, "Sandbox id (sbx_…)")->required();
  cmd->add_option("command", o->argv, "Command and arguments (after --)");
  cmd->add_option("--cwd", o->cwd, "Working directory (absolute path in the sandbox)");
  cmd->add_option("--user", o->user, "User to run as");
  cmd->add_option("-e,--env", o->env, "Environment variable KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  cmd->callback([o, &ctx] {
    std::optional<nlohmann::json> body = ExecBody(*o, ctx);
    if (!body) return;
    ctx.action = [o, body = std::move(*body)](Client& client) -> absl::StatusOr<int> {
      return RunExec(client, *o, body);
    };
  });
}

void RegisterAttach(CLI::App& app, Context& ctx) {
  struct Opts {
    std::string session_id;
    std::string last_event_id;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "attach", "Stream a session's output (starts it if not started); exit with its code");
  cmd->add_option("session", o->session_id, "Session id (ses_…)")->required();
  cmd->add_option("--last-event-id", o->last_event_id, "Resume after this event id")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            bool ok = !v.empty() && v.size() <= 19 &&
                      v.find_first_not_of("0123456789") == std::string::npos;
            return ok ? "" : "expected a non-negative event id";
          },
          "ID"));
  cmd->callback([o, &ctx] {
    if (absl::Status s = CheckId(o->session_id, "ses"); !s.ok()) {
      ctx.usage_errors.push_back({fmt::format("attach: {}", Msg(s))});
      return;
    }
    ctx.action = [o](Client& client) -> absl::StatusOr<int> {
      AttachTarget t;
      t.session_id = o->session_id;
      t.last_event_id = o->last_event_id;
      auto code = StreamSession(client, t);
      if (!code.ok() && absl::IsCancelled(code.status())) {
        PrintError(fmt::format("interrupted; session {} keeps running", t.session_id));
        return 128 + client.interrupt_signal();
      }
      return code;
    };
  });
}

}  // namespace

void RegisterSessionCommands(CLI::App& app, Context& ctx) {
  RegisterExec(app, ctx);
  RegisterAttach(app, ctx);
}

}  // namespace sbx::cli
