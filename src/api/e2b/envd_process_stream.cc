// process.Process/Start and /Connect: server streams over an sbx session's attach stream
// (as Api::Attach relays it as SSE), in Connect's envelopes: the start event first, output as
// data events, keepalives while idle, the end event, then the end-of-stream frame, which
// carries any error after the header (HTTP 200).
#include <fmt/format.h>

#include "api/e2b/envd_process.h"
#include "api/e2b/state.h"
#include "api/requests.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Output read per batch (one write to the client); base64 makes it 4/3 larger on the wire.
constexpr size_t kMaxBatchBytes = 768 << 10;
// Keepalive events at most this far apart (the SDKs ask for 50 s; proxies close sooner).
constexpr std::chrono::milliseconds kKeepaliveCap{15000};
// How long a spawn-failure report may precede its exit before the process counts as running.
constexpr std::chrono::milliseconds kSpawnReportWait{200};
// After the deadline's SIGKILL, how long the stream waits for the exit it causes.
constexpr std::chrono::milliseconds kKillExitWait{2000};

std::optional<std::string_view> Header(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string_view(it->value().data(), it->value().size());
}

// A stream that ends before it began: the header and the end-of-stream frame with the error.
http::Response ErrorStream(const http::Request& req, const RpcError& e) {
  http::Response res{bhttp::status::ok, req.version()};
  for (const auto& f : StreamHeader(req)) res.set(f.name_string(), f.value());
  res.body() = EndStreamEnvelope(e);
  res.prepare_payload();
  return res;
}

// An agent event kept past its batch (the frames point into the stream's buffer).
struct OwnedEvent {
  service::AttachEvent::Kind kind;
  service::OutputStream stream = service::OutputStream::kStdout;
  uint64_t event_id = 0;
  std::string data;
  service::SessionExit exit;
};

struct Relay {
  EnvdCall& call;
  service::AttachStream& stream;
  std::string session_id;
  int64_t pid = 0;
  bool pty = false;
  // Start: the stream's deadline kills the process (Connect's only ends the stream).
  bool kill_at_deadline = false;
  std::optional<Clock::time_point> deadline;
  std::chrono::milliseconds keepalive = kKeepaliveCap;
  uint64_t delivered = 0;

  // Appends the envelope of one event to `out`; true when it ended the stream (the exit).
  bool Append(std::string& out, const OwnedEvent& ev, std::optional<RpcError>& end_error) {
    switch (ev.kind) {
      case service::AttachEvent::Kind::kOutput: {
        const std::string_view kind =
            pty ? "pty" : (ev.stream == service::OutputStream::kStderr ? "stderr" : "stdout");
        out += MessageEnvelope(DataEvent(kind, ev.data));
        delivered = std::max(delivered, ev.event_id);
        return false;
      }
      case service::AttachEvent::Kind::kExit: {
        log::With(call.ctx.log, [&] {
          Gateway::Service(call.api).RecordSessionExit(session_id, ev.exit);
        });
        delivered = std::max(delivered, ev.exit.event_id);
        if (ev.exit.timed_out && kill_at_deadline) {
          // envd ends a Start whose deadline passed with deadline_exceeded, no end event.
          end_error = RpcError{Code::kDeadlineExceeded,
                               "the process ran past its deadline (Connect-Timeout-Ms) and was "
                               "killed"};
        } else {
          out += MessageEnvelope(EndEvent(ev.exit));
        }
        return true;
      }
      default:
        return false;  // resync: output no client took was dropped; nothing to say in E2B's terms
    }
  }

  static std::optional<OwnedEvent> Own(const service::AttachFrame& f) {
    auto ev = f.Decode();
    if (!ev.ok()) return std::nullopt;
    OwnedEvent o{ev->kind};
    if (ev->kind == service::AttachEvent::Kind::kOutput) {
      o.stream = ev->output.stream;
      o.event_id = ev->output.event_id;
      o.data = std::string(ev->output.data);
    } else if (ev->kind == service::AttachEvent::Kind::kExit) {
      o.exit = ev->exit;
    }
    return o;
  }

  // What a write sends: `batch`, then the end-of-stream frame when `done`.
  static std::string Finish(std::string batch, bool done, const std::optional<RpcError>& error) {
    if (done) batch += EndStreamEnvelope(error);
    return batch;
  }

  // The relay after the header; `early`: events read before it (Start's spawn check).
  http::asio::awaitable<void> Run(std::vector<OwnedEvent> early, absl::Status early_status) {
    std::string batch = MessageEnvelope(StartEvent(pid));
    std::optional<RpcError> error;
    bool done = false;
    for (const OwnedEvent& ev : early) {
      if ((done = Append(batch, ev, error))) break;
    }
    if (!done && !early_status.ok()) {
      error = AgentGone(early_status);
      done = true;
    }
    std::string out = Finish(std::move(batch), done, error);
    if (!co_await call.ctx.stream.Write(std::move(out))) {
      Gone();
      co_return;
    }
    if (delivered > 0) call.state.processes.Delivered(session_id, delivered);
    std::vector<service::AttachFrame> frames;
    bool killed = false;
    while (!done) {
      auto idle = keepalive;
      if (deadline) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
        if (left <= std::chrono::milliseconds(0)) {
          if (!kill_at_deadline || killed) {
            std::optional<RpcError> late = RpcError{
                Code::kDeadlineExceeded, "the stream's deadline (Connect-Timeout-Ms) passed"};
            std::string last = EndStreamEnvelope(late);
            co_await call.ctx.stream.Write(std::move(last));
            Gone();
            co_return;
          }
          // The agent's timeout (whole seconds) kills it too; the deadline is in ms.
          absl::Status signalled = co_await call.agent.Signal(call.ctx.executor, session_id, 9);
          (void)signalled;
          killed = true;
          deadline = Clock::now() + kKillExitWait;
          continue;
        }
        idle = std::min(idle, left);
      }
      absl::Status got = co_await stream.NextBatch(idle, kMaxBatchBytes, frames);
      batch.clear();
      if (!got.ok()) {
        error = AgentGone(got);
        done = true;
      } else if (frames.empty()) {
        if (deadline && Clock::now() >= *deadline) continue;
        batch = MessageEnvelope(KeepaliveEvent());
      } else {
        for (const service::AttachFrame& f : frames) {
          auto ev = Own(f);
          if (!ev) {
            error = RpcError{Code::kInternal, "the sandbox's agent sent an event that does not decode"};
            done = true;
            break;
          }
          if (killed && ev->kind == service::AttachEvent::Kind::kExit) ev->exit.timed_out = true;
          if ((done = Append(batch, *ev, error))) break;
        }
      }
      std::string chunk = Finish(std::move(batch), done, error);
      bool written = true;
      if (!chunk.empty()) written = co_await call.ctx.stream.Write(std::move(chunk));
      if (!written) {
        Gone();
        co_return;
      }
      if (delivered > 0) call.state.processes.Delivered(session_id, delivered);
    }
    stream.Close();
    co_await call.ctx.stream.End();
  }

  // The client went away: the process keeps running; only the agent stream closes.
  void Gone() { stream.Close(); }

  RpcError AgentGone(const absl::Status& why) {
    auto& svc = Gateway::Service(call.api);
    if (auto lost = svc.CheckAgentLost(call.sandbox_id)) {
      return RpcError{Code::kUnavailable, *lost};
    }
    return RpcError{Code::kUnavailable,
                    fmt::format("sandbox {}: the process's output stream broke: {}",
                                call.sandbox_id, std::string(why.message()))};
  }
};

bhttp::response_header<> HeaderFor(const EnvdCall& call) {
  auto h = StreamHeader(call.ctx.req);
  h.set("X-Request-Id", call.ctx.request_id);
  if (!call.ctx.req.keep_alive()) h.set(bhttp::field::connection, "close");
  return h;
}

}  // namespace

Awaitable ProcessStart(EnvdCall& call) {
  const http::Request& req = call.ctx.req;
  auto& svc = Gateway::Service(call.api);
  const auto ex = call.ctx.executor;
  auto fail = [&](const absl::Status& s) { return ErrorStream(req, RpcErrorFor(s)); };
  if (ShapeOf(req) != Shape::kStream) {
    co_return UnaryError(req, RpcError{Code::kInvalidArgument,
                                       "process.Process/Start is a server stream: Content-Type "
                                       "application/connect+json"});
  }
  auto msg = ParseStreamRequest(req.body());
  if (!msg.ok()) co_return fail(msg.status());
  auto spec = ParseStart(*msg);
  if (!spec.ok()) co_return fail(spec.status());
  auto timeout_ms = ParseTimeoutMs(Header(req, "Connect-Timeout-Ms"));
  if (!timeout_ms.ok()) co_return fail(timeout_ms.status());
  const auto started_at = Clock::now();
  // sbx's own request, through sbx's own parser: every limit and check of a session applies.
  auto sb = log::With(call.ctx.log, [&] { return svc.GetSandbox(call.owner, call.sandbox_id); });
  if (!sb.ok()) co_return fail(sb.status());
  auto parsed =
      ParseCreateSession(SessionBody(*spec, call.user, *timeout_ms, E2bDefaultEnv(*sb)).dump());
  if (!parsed.ok()) co_return fail(parsed.status());
  if (spec->config.cwd) {
    // envd refuses a cwd that does not exist before it starts anything.
    auto st = co_await call.agent.Stat(ex, *spec->config.cwd);
    if (!st.ok() && st.status().code() != absl::StatusCode::kNotFound) co_return fail(st.status());
    if (!st.ok() || st->type != "directory") {
      co_return ErrorStream(req, RpcError{Code::kInvalidArgument,
                                          fmt::format("cwd '{}' does not exist",
                                                      *spec->config.cwd)});
    }
  }
  auto created = log::With(call.ctx.log, [&] {
    return svc.CreateSession(call.owner, call.sandbox_id, *parsed, std::nullopt);
  });
  if (!created.ok()) co_return fail(created.status());
  if (!created->result) co_return fail(absl::InternalError("session create answered no session"));
  const std::string session_id = created->result->session.id;
  call.ctx.log.session = session_id;
  auto target = log::With(call.ctx.log, [&] { return svc.PrepareAttach(call.owner, session_id); });
  if (!target.ok()) co_return fail(target.status());
  auto awake = svc.activity().StreamOpened(call.sandbox_id);
  auto stream = co_await target->agent.Attach(ex, session_id, 0, target->spec);
  if (!stream.ok()) {
    // The first attach starts the process: not_found is then its user (envd: unauthenticated).
    if (stream.status().code() == absl::StatusCode::kNotFound) {
      co_return ErrorStream(req, RpcError{Code::kUnauthenticated,
                                          fmt::format("invalid user: {}", std::string(stream.status().message()))});
    }
    co_return fail(stream.status());
  }

  ProcessEntry entry;
  entry.sandbox_id = call.sandbox_id;
  entry.session_id = session_id;
  entry.pid = stream->reply().pid;
  entry.tag = spec->tag;
  entry.config = spec->config;
  entry.pty = spec->pty.has_value();
  call.state.processes.Put(entry);

  // The first events: a process that was over within a moment is recorded as started and
  // exited in one transaction (as Api::Attach does), and one that never ran (its exec or
  // chdir failed) is an error, not a process.
  std::vector<OwnedEvent> early;
  absl::Status early_status;
  std::optional<service::SessionExit> exit;
  std::string early_stderr;
  bool only_stderr = true;
  if (stream->started()) {
    std::vector<service::AttachFrame> frames;
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(service::kAttachExitWithin);
    const auto report_until = Clock::now() + kSpawnReportWait;
    while (!exit) {
      early_status = co_await stream->NextBatch(wait, kMaxBatchBytes, frames);
      if (!early_status.ok() || frames.empty()) break;
      bool bad = false;
      for (const service::AttachFrame& f : frames) {
        auto ev = Relay::Own(f);
        if (!ev) {
          bad = true;
          break;
        }
        if (ev->kind == service::AttachEvent::Kind::kOutput) {
          if (ev->stream == service::OutputStream::kStderr && early_stderr.size() < 4096) {
            early_stderr += ev->data;
          } else if (ev->stream != service::OutputStream::kStderr) {
            only_stderr = false;
          }
        }
        if (ev->kind == service::AttachEvent::Kind::kExit) exit = ev->exit;
        early.push_back(std::move(*ev));
        if (exit) break;
      }
      if (bad) break;
      if (!only_stderr || early_stderr.empty() || !MayBeSpawnFailure(early_stderr)) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(report_until - Clock::now());
      if (left <= std::chrono::milliseconds(0)) break;
      wait = left;
    }
  }
  log::With(call.ctx.log, [&] { svc.RecordSessionStarted(session_id, stream->started(), exit); });
  if (exit && only_stderr) {
    if (auto failure = SpawnFailure(*exit, early_stderr)) {
      stream->Close();
      co_return ErrorStream(req, *failure);
    }
  }

  Relay relay{call, *stream, session_id, entry.pid, entry.pty, /*kill_at_deadline=*/true};
  if (*timeout_ms && **timeout_ms > 0) {
    relay.deadline = started_at + std::chrono::milliseconds(**timeout_ms);
  }
  relay.keepalive = KeepaliveInterval(Header(req, "Keepalive-Ping-Interval"), kKeepaliveCap);
  if (!co_await call.ctx.stream.Begin(HeaderFor(call))) {
    stream->Close();
    co_return std::nullopt;
  }
  co_await relay.Run(std::move(early), early_status);
  co_return std::nullopt;
}

Awaitable ProcessConnect(EnvdCall& call) {
  const http::Request& req = call.ctx.req;
  auto& svc = Gateway::Service(call.api);
  const auto ex = call.ctx.executor;
  auto fail = [&](const absl::Status& s) { return ErrorStream(req, RpcErrorFor(s)); };
  if (ShapeOf(req) != Shape::kStream) {
    co_return UnaryError(req, RpcError{Code::kInvalidArgument,
                                       "process.Process/Connect is a server stream: Content-Type "
                                       "application/connect+json"});
  }
  auto msg = ParseStreamRequest(req.body());
  if (!msg.ok()) co_return fail(msg.status());
  auto sel = ParseSelector(*msg);
  if (!sel.ok()) co_return fail(sel.status());
  auto timeout_ms = ParseTimeoutMs(Header(req, "Connect-Timeout-Ms"));
  if (!timeout_ms.ok()) co_return fail(timeout_ms.status());
  const auto started_at = Clock::now();
  auto e = co_await ResolveProcess(call, *sel);
  if (!e.ok()) co_return ErrorStream(req, ProcessCallError(e.status(), *sel));
  call.ctx.log.session = e->session_id;
  // envd forgets a process once it ended: connecting to it is not_found.
  auto status = co_await call.agent.Status(ex, e->session_id);
  if (!status.ok()) co_return ErrorStream(req, ProcessCallError(status.status(), *sel));
  if (status->state != "running") {
    co_return ErrorStream(req, RpcError{Code::kNotFound, fmt::format("{} not found", sel->Describe())});
  }
  auto awake = svc.activity().StreamOpened(call.sandbox_id);
  // New output only: after what E2B streams relayed already (a session this sbxd has not
  // relayed, e.g. since a restart, replays what the agent retains). No spec: never starts one.
  const uint64_t after = call.state.processes.BySession(e->session_id).value_or(*e).delivered;
  auto stream = co_await call.agent.Attach(ex, e->session_id, after, std::nullopt);
  if (!stream.ok()) co_return ErrorStream(req, ProcessCallError(stream.status(), *sel));

  Relay relay{call, *stream, e->session_id, stream->reply().pid, e->pty, /*kill_at_deadline=*/false};
  relay.delivered = after;
  if (*timeout_ms && **timeout_ms > 0) {
    relay.deadline = started_at + std::chrono::milliseconds(**timeout_ms);
  }
  relay.keepalive = KeepaliveInterval(Header(req, "Keepalive-Ping-Interval"), kKeepaliveCap);
  if (!co_await call.ctx.stream.Begin(HeaderFor(call))) {
    stream->Close();
    co_return std::nullopt;
  }
  std::vector<OwnedEvent> none;
  co_await relay.Run(std::move(none), absl::OkStatus());
  co_return std::nullopt;
}

}  // namespace sbx::api::e2b
