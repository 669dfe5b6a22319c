// The start command of a template (runtime::TemplateSpec::start_cmd, docs/templates.md "Start
// command"): a process started in every new sandbox of the template, the sandbox running only
// once the template's readiness check passes. Run on the thread that builds the sandbox (a
// create job, the warm-pool filler), before the sandbox is handed to anyone.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include "common/status_util.h"
#include "service/agent_client.h"
#include "service/service_internal.h"

namespace sbx::service::internal {

namespace {

constexpr char kStartSession[] = "template-start";
constexpr std::chrono::milliseconds kReadyInterval{100};
constexpr size_t kKeptOutput = 2048;

std::map<std::string, std::string> EnvOf(const runtime::TemplateSpec& t) {
  std::map<std::string, std::string> env;
  env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (const std::string& e : t.env) {
    const size_t eq = e.find('=');
    if (eq != std::string::npos && eq > 0) env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return env;
}

protocol::SessionSpec SpecOf(const runtime::TemplateSpec& t, std::vector<std::string> argv) {
  protocol::SessionSpec s;
  s.argv = std::move(argv);
  s.cwd = t.workdir.empty() ? "/" : t.workdir;
  s.env = EnvOf(t);
  s.user = t.default_user == "root" ? "" : t.default_user;
  return s;
}

// Runs `spec` as session `id` to its end: its exit code (or ending) and the last of its output.
asio::awaitable<absl::StatusOr<std::pair<std::string, std::string>>> RunToEnd(
    AgentClient& agent, std::string id, protocol::SessionSpec spec,
    std::chrono::steady_clock::time_point deadline) {
  auto ex = co_await asio::this_coro::executor;
  auto stream = co_await agent.Attach(ex, id, 0, spec);
  if (!stream.ok()) co_return stream.status();
  std::string out;
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline) {
      (void)co_await agent.Signal(ex, id, SIGKILL);
      co_return std::make_pair(std::string("timed out"), out);
    }
    auto frame = co_await stream->Next(std::chrono::milliseconds(200));
    if (!frame.ok()) co_return frame.status();
    if (!frame->has_value()) continue;
    auto ev = (*frame)->Decode();
    if (!ev.ok()) co_return ev.status();
    if (ev->kind == AttachEvent::Kind::kOutput) {
      out.append(ev->output.data);
      if (out.size() > kKeptOutput) out.erase(0, out.size() - kKeptOutput);
    } else if (ev->kind == AttachEvent::Kind::kExit) {
      const SessionExit& e = ev->exit;
      std::string how = e.exit_code ? fmt::format("exited with code {}", *e.exit_code)
                        : e.signal  ? "was killed by " + *e.signal
                                    : "ended";
      co_return std::make_pair(e.exit_code && *e.exit_code == 0 ? std::string() : how, out);
    }
  }
}

asio::awaitable<absl::Status> StartAndWait(AgentClient agent, const runtime::TemplateSpec& t) {
  auto ex = co_await asio::this_coro::executor;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(std::max(1, t.start_timeout_s));
  {
    // Started and left running: the attach is only how a session starts.
    auto started = co_await agent.Attach(ex, kStartSession, 0, SpecOf(t, t.start_cmd));
    if (!started.ok()) co_return Annotate(started.status(), "template start command");
    started->Close();
  }
  if (t.ready_cmd.empty()) co_return absl::OkStatus();
  std::string last;
  asio::steady_timer timer(ex);
  for (int n = 1;; ++n) {
    auto ran = co_await RunToEnd(agent, fmt::format("template-ready-{}", n),
                                 SpecOf(t, t.ready_cmd), deadline);
    if (!ran.ok()) co_return Annotate(ran.status(), "template readiness check");
    if (ran->first.empty()) co_return absl::OkStatus();
    last = fmt::format("{}{}{}", ran->first, ran->second.empty() ? "" : "; its output: ",
                       ran->second.substr(0, 512));
    auto st = co_await agent.Status(ex, kStartSession);
    if (st.ok() && st->state == "exited") {
      co_return absl::FailedPreconditionError(fmt::format(
          "the template's start command {} before its readiness check passed (last check: {})",
          st->exit_code ? fmt::format("exited with code {}", *st->exit_code)
                        : "was killed by " + st->signal.value_or("a signal"),
          last));
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    timer.expires_after(kReadyInterval);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return absl::DeadlineExceededError(fmt::format(
      "the template's readiness check did not pass within {} s (last: {})", t.start_timeout_s, last));
}

}  // namespace

absl::Status StartTemplateProcess(const runtime::Instance& inst, const runtime::TemplateSpec& t) {
  if (t.start_cmd.empty()) return absl::OkStatus();
  asio::io_context ioc;
  absl::Status out = absl::UnknownError("template start did not run");
  AgentClient agent = AgentClient::ForSocket(inst.AgentSocketPath());
  asio::co_spawn(
      ioc, [&]() -> asio::awaitable<void> { out = co_await StartAndWait(agent, t); },
      asio::detached);
  ioc.run();
  return out;
}

}  // namespace sbx::service::internal
