// envd's process.Process service (e2b-compat.md §8) over sbx sessions: the request and event
// shapes, the unary RPCs (List, SendInput, StreamInput, CloseStdin, SendSignal, Update) and the
// dispatch. Start and Connect, the streams, are in envd_process_stream.cc.
#include "api/e2b/envd_process.h"

#include <fmt/format.h>

#include "api/e2b/errors.h"
#include "api/e2b/state.h"
#include "common/base64.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;

#define E2B_CONCAT_INNER_(a, b) a##b
#define E2B_CONCAT_(a, b) E2B_CONCAT_INNER_(a, b)
// SBX_ASSIGN_OR_RETURN in a coroutine.
#define E2B_CO_ASSIGN_OR_RETURN(lhs, expr) \
  E2B_CO_ASSIGN_OR_RETURN_IMPL_(E2B_CONCAT_(e2b_tmp_, __LINE__), lhs, expr)
#define E2B_CO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) co_return tmp.status();              \
  lhs = std::move(*tmp)

absl::Status Bad(std::string_view field, std::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                  fmt::format("{}: {}", field, message));
}

absl::StatusOr<std::string> StringField(const json& msg, std::string_view name,
                                        std::string_view field) {
  const json* v = Field(msg, name);
  if (!v) return std::string();
  if (!v->is_string()) return Bad(field, "must be a string");
  return v->get<std::string>();
}

// A uint32 (pid, cols, rows): a number or a numeric string.
absl::StatusOr<int64_t> Uint32(const json& v, std::string_view field) {
  auto n = JsonInt(v);
  if (!n || *n < 0 || *n > int64_t{UINT32_MAX}) return Bad(field, "must be a uint32");
  return *n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Messages

absl::StatusOr<StartSpec> ParseStart(const json& msg) {
  StartSpec s;
  const json* proc = Field(msg, "process");
  if (!proc || !proc->is_object()) return Bad("process", "is required (a ProcessConfig)");
  SBX_ASSIGN_OR_RETURN(s.config.cmd, StringField(*proc, "cmd", "process.cmd"));
  if (s.config.cmd.empty()) return Bad("process.cmd", "is required");
  if (const json* args = Field(*proc, "args")) {
    if (!args->is_array()) return Bad("process.args", "must be an array of strings");
    for (const json& a : *args) {
      if (!a.is_string()) return Bad("process.args", "must be an array of strings");
      s.config.args.push_back(a.get<std::string>());
    }
  }
  if (const json* envs = Field(*proc, "envs")) {
    if (!envs->is_object()) return Bad("process.envs", "must be a map of strings");
    for (const auto& [k, v] : envs->items()) {
      if (!v.is_string()) return Bad("process.envs", "must be a map of strings");
      s.config.envs[k] = v.get<std::string>();
    }
  }
  if (const json* cwd = Field(*proc, "cwd")) {
    if (!cwd->is_string()) return Bad("process.cwd", "must be a string");
    if (!cwd->get_ref<const std::string&>().empty()) s.config.cwd = cwd->get<std::string>();
  }
  if (const json* pty = Field(msg, "pty")) {
    SBX_ASSIGN_OR_RETURN(s.pty, ParsePty(*pty, "pty"));
  }
  if (const json* tag = Field(msg, "tag")) {
    if (!tag->is_string()) return Bad("tag", "must be a string");
    if (tag->get_ref<const std::string&>().size() > 4096) return Bad("tag", "at most 4096 bytes");
    s.tag = tag->get<std::string>();
  }
  if (const json* in = Field(msg, "stdin")) {
    if (!in->is_boolean()) return Bad("stdin", "must be a boolean");
    s.stdin = in->get<bool>();
  }
  return s;
}

json SessionBody(const StartSpec& s, const std::optional<std::string>& user,
                 std::optional<int64_t> timeout_ms, const json& defaults) {
  json argv = json::array({s.config.cmd});
  for (const std::string& a : s.config.args) argv.push_back(a);
  json env = defaults.is_object() ? defaults : json::object();
  for (const auto& [k, v] : s.config.envs) env[k] = v;
  json body = {{"argv", std::move(argv)}, {"env", std::move(env)}, {"stdin", s.stdin}};
  if (s.config.cwd) body["cwd"] = *s.config.cwd;
  if (user) body["user"] = *user;
  if (s.pty) body["tty"] = {{"rows", s.pty->rows}, {"cols", s.pty->cols}};
  if (timeout_ms && *timeout_ms > 0) {
    constexpr int64_t kMaxS = 30LL * 86400;
    body["timeout_s"] = std::min(kMaxS, (*timeout_ms + 999) / 1000);
    body["kill_grace_s"] = 0;
  }
  return body;
}

std::string Selector::Describe() const {
  if (pid) return fmt::format("process with pid {}", *pid);
  return fmt::format("process with tag \"{}\"", tag.value_or(""));
}

absl::StatusOr<Selector> ParseSelector(const json& msg) {
  const json* p = Field(msg, "process");
  if (!p || !p->is_object()) return Bad("process", "is required (a ProcessSelector: pid or tag)");
  Selector sel;
  const json* pid = Field(*p, "pid");
  const json* tag = Field(*p, "tag");
  if (pid && tag) return Bad("process", "names both a pid and a tag");
  if (pid) {
    SBX_ASSIGN_OR_RETURN(sel.pid, Uint32(*pid, "process.pid"));
  } else if (tag) {
    if (!tag->is_string()) return Bad("process.tag", "must be a string");
    sel.tag = tag->get<std::string>();
  } else {
    return Bad("process", "names neither a pid nor a tag");
  }
  return sel;
}

absl::StatusOr<int> ParseSignal(const json& msg) {
  const json* v = Field(msg, "signal");
  if (!v) return Bad("signal", "is required (SIGNAL_SIGKILL or SIGNAL_SIGTERM)");
  std::optional<int> signo;
  if (v->is_string()) {
    std::string name = v->get<std::string>();
    if (auto n = JsonInt(*v)) {
      if (*n > 0 && *n < 65) signo = static_cast<int>(*n);
    } else {
      if (name.rfind("SIGNAL_", 0) == 0) name = name.substr(7);
      if (name != "UNSPECIFIED" && !name.empty()) signo = service::SignalNumber(name);
    }
  } else if (auto n = JsonInt(*v); n && *n > 0 && *n < 65) {
    signo = static_cast<int>(*n);
  }
  if (!signo || !service::SignalName(*signo)) {
    return Bad("signal", "must be SIGNAL_SIGKILL, SIGNAL_SIGTERM or a signal number");
  }
  return *signo;
}

absl::StatusOr<std::string> ParseInput(const json& input, std::string_view field) {
  if (!input.is_object()) return Bad(field, "must be a ProcessInput (stdin or pty)");
  const json* v = Field(input, "stdin");
  if (!v) v = Field(input, "pty");
  if (!v) return std::string();  // an empty oneof: nothing to write
  auto bytes = JsonBytes(*v);
  if (!bytes) return Bad(field, "stdin/pty must be base64");
  return *bytes;
}

absl::StatusOr<PtySize> ParsePty(const json& pty, std::string_view field) {
  if (!pty.is_object()) return Bad(field, "must be a PTY {size: {cols, rows}}");
  const json* size = Field(pty, "size");
  if (!size || !size->is_object()) return Bad(fmt::format("{}.size", field), "is required");
  PtySize out;
  const json* rows = Field(*size, "rows");
  const json* cols = Field(*size, "cols");
  if (!rows || !cols) return Bad(fmt::format("{}.size", field), "needs cols and rows");
  SBX_ASSIGN_OR_RETURN(out.rows, Uint32(*rows, fmt::format("{}.size.rows", field)));
  SBX_ASSIGN_OR_RETURN(out.cols, Uint32(*cols, fmt::format("{}.size.cols", field)));
  if (out.rows < 1 || out.rows > 1000 || out.cols < 1 || out.cols > 1000) {
    return Bad(fmt::format("{}.size", field), "cols and rows must be 1-1000");
  }
  return out;
}

absl::StatusOr<std::optional<int64_t>> ParseTimeoutMs(std::optional<std::string_view> header) {
  if (!header) return std::optional<int64_t>();
  const std::string_view h = *header;
  if (h.empty() || h.size() > 10 || h.find_first_not_of("0123456789") != std::string_view::npos) {
    return Bad("Connect-Timeout-Ms", "must be 1 to 10 digits");
  }
  return std::optional<int64_t>(std::stoll(std::string(h)));
}

std::chrono::milliseconds KeepaliveInterval(std::optional<std::string_view> header,
                                            std::chrono::milliseconds cap) {
  if (!header || header->empty() || header->size() > 6 ||
      header->find_first_not_of("0123456789") != std::string_view::npos) {
    return cap;
  }
  const int64_t s = std::stoll(std::string(*header));
  if (s < 1) return cap;
  return std::min(cap, std::chrono::milliseconds(s * 1000));
}

json StartEvent(int64_t pid) { return {{"event", {{"start", {{"pid", pid}}}}}}; }

json DataEvent(std::string_view kind, std::string_view bytes) {
  return {{"event", {{"data", {{std::string(kind), Base64Encode(bytes)}}}}}};
}

json KeepaliveEvent() { return {{"event", {{"keepalive", json::object()}}}}; }

std::string ExitStatusText(const service::SessionExit& exit) {
  if (exit.exit_code) return fmt::format("exit status {}", *exit.exit_code);
  if (!exit.signal) return "unknown";
  // Go's syscall signal strings (what envd's ProcessState.String() says).
  static const std::map<std::string, std::string> kText = {
      {"SIGHUP", "hangup"},          {"SIGINT", "interrupt"},
      {"SIGQUIT", "quit"},           {"SIGILL", "illegal instruction"},
      {"SIGTRAP", "trace/breakpoint trap"}, {"SIGABRT", "aborted"},
      {"SIGBUS", "bus error"},       {"SIGFPE", "floating point exception"},
      {"SIGKILL", "killed"},         {"SIGUSR1", "user defined signal 1"},
      {"SIGSEGV", "segmentation fault"}, {"SIGUSR2", "user defined signal 2"},
      {"SIGPIPE", "broken pipe"},    {"SIGALRM", "alarm clock"},
      {"SIGTERM", "terminated"},     {"SIGXCPU", "CPU time limit exceeded"},
      {"SIGXFSZ", "file size limit exceeded"}, {"SIGSYS", "bad system call"},
  };
  auto it = kText.find(*exit.signal);
  return "signal: " + (it != kText.end() ? it->second : *exit.signal);
}

json EndEvent(const service::SessionExit& exit) {
  json end = {{"exitCode", exit.exit_code.value_or(-1)},
              {"exited", exit.exit_code.has_value()},
              {"status", ExitStatusText(exit)}};
  if (exit.exit_code.value_or(-1) != 0) end["error"] = end["status"];
  return {{"event", {{"end", std::move(end)}}}};
}

bool MayBeSpawnFailure(std::string_view stderr_text) {
  constexpr std::string_view kPrefix = "sbx-agent: ";
  return stderr_text.substr(0, kPrefix.size()) == kPrefix.substr(0, stderr_text.size());
}

std::optional<RpcError> SpawnFailure(const service::SessionExit& exit,
                                     std::string_view stderr_text) {
  if (!exit.exit_code || (*exit.exit_code != 126 && *exit.exit_code != 127)) return std::nullopt;
  constexpr std::string_view kPrefix = "sbx-agent: ";
  if (stderr_text.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view line = stderr_text.substr(kPrefix.size());
  line = line.substr(0, line.find('\n'));
  if (line.size() > 1024) line = line.substr(0, 1024);
  const bool exec = line.rfind("exec ", 0) == 0;
  const bool chdir = line.rfind("chdir ", 0) == 0;
  if (!exec && !chdir && line.find(" for ") == std::string_view::npos) return std::nullopt;
  RpcError e;
  if (chdir) {
    // envd: "cwd '<p>' does not exist".
    std::string_view rest = line.substr(6);
    const std::string_view path = rest.substr(0, rest.rfind(": "));
    e.code = Code::kInvalidArgument;
    e.message = fmt::format("cwd '{}' does not exist or is not a directory ({})", path, line);
  } else if (exec && line.find("No such file or directory") != std::string_view::npos) {
    e.code = Code::kNotFound;
    e.message = fmt::format("error starting process: {}", line);
  } else {
    e.code = Code::kInvalidArgument;
    e.message = fmt::format("error starting process: {}", line);
  }
  return e;
}

absl::StatusOr<std::vector<json>> ParseClientStream(std::string_view body, size_t max_messages) {
  std::vector<json> out;
  while (!body.empty()) {
    if (body.size() < 5) return Bad("body", "a truncated envelope");
    const auto flags = static_cast<uint8_t>(body[0]);
    const uint32_t n = (uint32_t{static_cast<uint8_t>(body[1])} << 24) |
                       (uint32_t{static_cast<uint8_t>(body[2])} << 16) |
                       (uint32_t{static_cast<uint8_t>(body[3])} << 8) |
                       uint32_t{static_cast<uint8_t>(body[4])};
    if (body.size() - 5 < n) return Bad("body", "a truncated envelope");
    if (flags & kFlagCompressed) return Bad("body", "compressed envelopes are not accepted");
    if (flags & kFlagEndStream) break;
    if (flags != 0) return Bad("body", fmt::format("envelope flags {:#x}", flags));
    if (out.size() >= max_messages) {
      return Bad("body", fmt::format("at most {} messages in one stream", max_messages));
    }
    SBX_ASSIGN_OR_RETURN(json m, ParseUnaryRequest(body.substr(5, n)));
    out.push_back(std::move(m));
    body.remove_prefix(5 + size_t{n});
  }
  return out;
}

json ProcessInfoJson(int64_t pid, const ProcessConfigInfo& c, const std::optional<std::string>& tag) {
  json config = {{"cmd", c.cmd}, {"args", c.args}, {"envs", c.envs}};
  if (c.cwd) config["cwd"] = *c.cwd;
  json info = {{"pid", pid}, {"config", std::move(config)}};
  if (tag) info["tag"] = *tag;
  return info;
}

ProcessConfigInfo ConfigFromSpec(const json& spec) {
  ProcessConfigInfo c;
  if (!spec.is_object()) return c;
  if (auto it = spec.find("argv"); it != spec.end() && it->is_array()) {
    for (const json& a : *it) {
      if (!a.is_string()) continue;
      if (c.cmd.empty() && c.args.empty()) {
        c.cmd = a.get<std::string>();
      } else {
        c.args.push_back(a.get<std::string>());
      }
    }
  }
  if (auto it = spec.find("env"); it != spec.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      // envd lists what the Start asked for, not the variables it adds itself.
      if (k == "E2B_SANDBOX" || k == "E2B_SANDBOX_ID" || k == "E2B_TEAM_ID" ||
          k == "E2B_TEMPLATE_ID") {
        continue;
      }
      if (v.is_string()) c.envs[k] = v.get<std::string>();
    }
  }
  if (auto it = spec.find("cwd"); it != spec.end() && it->is_string() &&
      !it->get_ref<const std::string&>().empty()) {
    c.cwd = it->get<std::string>();
  }
  return c;
}

RpcError ProcessCallError(const absl::Status& s, const Selector& sel) {
  const std::string code = ApiErrorCode(s);
  const std::string msg(s.message());
  if (s.code() == absl::StatusCode::kNotFound ||
      (s.code() == absl::StatusCode::kFailedPrecondition &&
       msg.find("has exited") != std::string::npos)) {
    return RpcError{Code::kNotFound, fmt::format("{} not found", sel.Describe())};
  }
  return RpcErrorFor(s);
}

// ---------------------------------------------------------------------------------------------
// Process resolution

namespace {

// The agent's process list, reduced to what resolution needs: {pid, ppid, pgid, session_id}
// of each process (the rest of the guest-sized reply is dropped while it is parsed).
struct ListedProcess {
  int64_t pid = 0, ppid = 0, pgid = 0;
  std::string session_id;
};

http::asio::awaitable<absl::StatusOr<std::vector<ListedProcess>>> AgentProcesses(EnvdCall& call) {
  auto slot = co_await Gateway::Service(call.api).guest_replies().Acquire(call.ctx.executor,
                                                                          call.sandbox_id);
  if (!slot.ok()) co_return slot.status();
  auto body = co_await call.agent.ProcessesBody(call.ctx.executor, "{");
  if (!body.ok()) co_return body.status();
  json::parser_callback_t keep = [](int depth, json::parse_event_t ev, json& parsed) {
    if (ev != json::parse_event_t::key) return true;
    if (depth <= 1) return parsed == "processes";
    const std::string& k = parsed.get_ref<const std::string&>();
    return k == "pid" || k == "ppid" || k == "pgid" || k == "session_id";
  };
  json j = json::parse(*body, keep, /*allow_exceptions=*/false);
  std::vector<ListedProcess> out;
  if (!j.is_object() || !j.contains("processes") || !j["processes"].is_array()) co_return out;
  for (const json& p : j["processes"]) {
    if (!p.is_object()) continue;
    ListedProcess lp;
    lp.pid = JsonInt(p.value("pid", json())).value_or(0);
    lp.ppid = JsonInt(p.value("ppid", json())).value_or(0);
    lp.pgid = JsonInt(p.value("pgid", json())).value_or(0);
    if (auto s = p.find("session_id"); s != p.end() && s->is_string()) lp.session_id = *s;
    if (lp.pid > 0) out.push_back(std::move(lp));
  }
  co_return out;
}

// The running pid of `session_id` as the agent reports it (nullopt: not running).
http::asio::awaitable<std::optional<int64_t>> RunningPid(EnvdCall& call,
                                                        const std::string& session_id) {
  auto st = co_await call.agent.Status(call.ctx.executor, session_id);
  if (!st.ok() || st->state != "running" || !st->pid) co_return std::nullopt;
  co_return *st->pid;
}

}  // namespace

http::asio::awaitable<absl::StatusOr<ProcessEntry>> ResolveProcess(EnvdCall& call,
                                                                   Selector sel) {
  ProcessTable& table = call.state.processes;
  const auto not_found = [&] {
    return ApiError(absl::StatusCode::kNotFound, "not_found",
                    fmt::format("{} not found", sel.Describe()));
  };
  if (sel.tag) {
    auto e = table.ByTag(call.sandbox_id, *sel.tag);
    if (!e) co_return not_found();
    co_return *e;
  }
  if (auto e = table.ByPid(call.sandbox_id, *sel.pid)) co_return *e;
  // Not started through this sbxd's E2B API (or before it restarted): the agent knows which
  // session the process belongs to, and whether it leads it.
  auto procs = co_await AgentProcesses(call);
  if (!procs.ok()) co_return procs.status();
  for (const ListedProcess& p : *procs) {
    if (p.pid != *sel.pid || p.session_id.empty()) continue;
    auto pid = co_await RunningPid(call, p.session_id);
    if (!pid || *pid != p.pid) break;  // a child of a session, not its process
    auto record = Gateway::Service(call.api).GetSession(call.owner, p.session_id);
    if (!record.ok() || record->sandbox_id != call.sandbox_id) break;
    ProcessEntry e;
    e.sandbox_id = call.sandbox_id;
    e.session_id = p.session_id;
    e.pid = p.pid;
    e.pty = record->spec.is_object() && record->spec.contains("tty") &&
            !record->spec["tty"].is_null() && record->spec["tty"] != false;
    table.Put(e);
    co_return e;
  }
  co_return not_found();
}

// ---------------------------------------------------------------------------------------------
// Unary RPCs

namespace {

using Reply = absl::StatusOr<json>;

// Writes `data` to the process's input (stdin or its terminal): SendInput and StreamInput.
http::asio::awaitable<absl::Status> WriteInput(EnvdCall& call, const ProcessEntry& e,
                                               const std::string& data) {
  if (data.empty()) co_return absl::OkStatus();
  auto r = co_await call.agent.Stdin(call.ctx.executor, e.session_id, data);
  if (r.ok()) Gateway::Service(call.api).activity().Touch(call.sandbox_id);
  co_return r.status();
}

http::asio::awaitable<Reply> List(EnvdCall& call) {
  auto procs = co_await AgentProcesses(call);
  if (!procs.ok()) co_return procs.status();
  json out = json::array();
  // A session's process is a child of the agent (ppid 1) leading its own group.
  for (const ListedProcess& p : *procs) {
    if (p.session_id.empty() || p.ppid != 1 || p.pgid != p.pid) continue;
    auto e = call.state.processes.BySession(p.session_id);
    if (!e || e->pid != p.pid) {
      // Not known here (or a leftover of an exited session in a group of its own): ask.
      auto pid = co_await RunningPid(call, p.session_id);
      if (!pid || *pid != p.pid) continue;
      if (!e) {
        ProcessEntry fresh;
        fresh.sandbox_id = call.sandbox_id;
        fresh.session_id = p.session_id;
        fresh.pid = p.pid;
        call.state.processes.Put(fresh);
        e = fresh;
      }
    }
    ProcessConfigInfo config;
    if (e->config) {
      config = *e->config;
    } else if (auto rec = Gateway::Service(call.api).GetSession(call.owner, p.session_id);
               rec.ok()) {
      config = ConfigFromSpec(rec->spec);
    } else {
      continue;  // another tenant's? never in this sandbox; skip what cannot be described
    }
    out.push_back(ProcessInfoJson(p.pid, config, e->tag));
  }
  co_return json{{"processes", std::move(out)}};
}

http::asio::awaitable<Reply> OnProcess(EnvdCall& call, const json& msg, std::string_view method) {
  Selector sel;
  E2B_CO_ASSIGN_OR_RETURN(sel, ParseSelector(msg));
  // The rest of the message before any agent call: bad input is invalid_argument whatever
  // the process's state.
  std::string input;
  int signo = 0;
  std::optional<PtySize> size;
  if (method == "SendInput") {
    const json* in = Field(msg, "input");
    if (!in) co_return Bad("input", "is required");
    E2B_CO_ASSIGN_OR_RETURN(input, ParseInput(*in, "input"));
  } else if (method == "SendSignal") {
    E2B_CO_ASSIGN_OR_RETURN(signo, ParseSignal(msg));
  } else if (method == "Update") {
    if (const json* pty = Field(msg, "pty")) {
      E2B_CO_ASSIGN_OR_RETURN(size, ParsePty(*pty, "pty"));
    }
  }
  auto e = co_await ResolveProcess(call, sel);
  if (!e.ok()) co_return e.status();
  const auto ex = call.ctx.executor;
  absl::Status st;
  if (method == "SendInput") {
    st = co_await WriteInput(call, *e, input);
  } else if (method == "CloseStdin") {
    st = (co_await call.agent.StdinClose(ex, e->session_id)).status();
  } else if (method == "SendSignal") {
    st = co_await call.agent.Signal(ex, e->session_id, signo);
  } else if (size) {
    st = co_await call.agent.Resize(ex, e->session_id, static_cast<uint16_t>(size->rows),
                                    static_cast<uint16_t>(size->cols));
  } else {
    // Update without a pty changes nothing; the process must still exist.
    auto status = co_await call.agent.Status(ex, e->session_id);
    if (status.ok() && status->state != "running") {
      st = absl::NotFoundError("the process has exited");
    } else {
      st = status.status();
    }
  }
  if (!st.ok()) co_return st;
  co_return json::object();
}

// StreamInput (client stream): start {process}, then data {input} and keepalive {} messages.
http::asio::awaitable<std::optional<RpcError>> StreamInput(EnvdCall& call) {
  auto msgs = ParseClientStream(call.ctx.req.body(), 4096);
  if (!msgs.ok()) co_return RpcErrorFor(msgs.status());
  std::optional<ProcessEntry> e;
  std::optional<Selector> sel;
  for (const json& m : *msgs) {
    if (const json* start = Field(m, "start")) {
      if (sel) co_return RpcErrorFor(Bad("start", "sent twice"));
      auto s = ParseSelector(*start);
      if (!s.ok()) co_return RpcErrorFor(s.status());
      sel = *s;
      auto r = co_await ResolveProcess(call, *sel);
      if (!r.ok()) co_return ProcessCallError(r.status(), *sel);
      e = *r;
    } else if (const json* data = Field(m, "data")) {
      if (!e) co_return RpcErrorFor(Bad("data", "before start"));
      const json* in = Field(*data, "input");
      if (!in) continue;
      auto bytes = ParseInput(*in, "data.input");
      if (!bytes.ok()) co_return RpcErrorFor(bytes.status());
      absl::Status st = co_await WriteInput(call, *e, *bytes);
      if (!st.ok()) co_return ProcessCallError(st, *sel);
    } else if (!Field(m, "keepalive") && !m.empty()) {
      co_return RpcErrorFor(Bad("message", "must be start, data or keepalive"));
    }
  }
  if (!e) co_return RpcErrorFor(Bad("start", "is required"));
  co_return std::nullopt;
}

}  // namespace

Awaitable ProcessRpc(EnvdCall& call, std::string_view method) {
  const http::Request& req = call.ctx.req;
  if (method == "Start") co_return co_await ProcessStart(call);
  if (method == "Connect") co_return co_await ProcessConnect(call);
  if (method == "StreamInput") {
    // A client stream: its answer is a stream too (one message, then the end-of-stream frame).
    std::optional<RpcError> err;
    if (ShapeOf(req) != Shape::kStream) {
      err = RpcError{Code::kInvalidArgument,
                     "StreamInput is a client stream: Content-Type application/connect+json"};
    } else {
      err = co_await StreamInput(call);
    }
    http::Response res{bhttp::status::ok, req.version()};
    for (const auto& f : StreamHeader(req)) res.set(f.name_string(), f.value());
    res.body() = (err ? std::string() : MessageEnvelope(json::object())) + EndStreamEnvelope(err);
    res.prepare_payload();
    co_return res;
  }
  const bool unary = method == "List" || method == "SendInput" || method == "SendSignal" ||
                     method == "CloseStdin" || method == "Update";
  if (!unary) {
    co_return UnaryError(req, RpcError{Code::kUnimplemented,
                                       fmt::format("process.Process has no method {}", method)});
  }
  if (ShapeOf(req) != Shape::kUnary) {
    co_return UnaryError(req, RpcError{Code::kInvalidArgument,
                                       fmt::format("process.Process/{} is unary: Content-Type "
                                                   "application/json",
                                                   method)});
  }
  auto msg = ParseUnaryRequest(req.body());
  if (!msg.ok()) co_return UnaryError(req, RpcErrorFor(msg.status()));
  // (No co_await inside ?: : GCC 12 destroys its result twice.)
  Reply r = absl::UnknownError("");
  if (method == "List") {
    r = co_await List(call);
  } else {
    r = co_await OnProcess(call, *msg, method);
  }
  if (!r.ok()) {
    if (method == "List") co_return UnaryError(req, RpcErrorFor(r.status()));
    auto sel = ParseSelector(*msg);
    co_return UnaryError(req, sel.ok() && r.status().code() != absl::StatusCode::kInvalidArgument
                                  ? ProcessCallError(r.status(), *sel)
                                  : RpcErrorFor(r.status()));
  }
  co_return UnaryReply(req, *r);
}

}  // namespace sbx::api::e2b
