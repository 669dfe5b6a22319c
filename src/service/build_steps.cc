// SandboxService::RunBuildStep (build_step.h): a template build's RUN, COPY, ADD or WORKDIR in a
// sandbox of its own, whose writable layer becomes the step's layer.
#include <csignal>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/build_step.h"
#include "service/sandbox_service.h"
#include "service/tenancy.h"
#include "service/service_internal.h"

namespace sbx::service {

using namespace internal;  // this folder's helpers (service_internal.h)

namespace {

constexpr char kBuildSession[] = "build";
// How often a quiet RUN is checked for a cancel.
constexpr std::chrono::milliseconds kCancelPoll{200};

std::string Ending(const SessionExit& e) {
  if (e.timed_out) return "timed out";
  if (e.oom_killed) return "was killed: out of memory (the build's memory_mib)";
  if (e.signal) return "was killed by " + *e.signal;
  if (e.exit_code && *e.exit_code != 0) return fmt::format("exited with code {}", *e.exit_code);
  return "";
}

// The agent side of a step, on a private io_context: files in, then the process to its end.
asio::awaitable<absl::StatusOr<std::optional<std::string>>> Drive(AgentClient agent,
                                                                  const BuildStepRequest& req) {
  auto ex = co_await asio::this_coro::executor;
  if (req.files) {
    protocol::WriteRequest w;
    w.tar = true;
    w.path = "/";
    if (!req.files_owner.empty()) w.user = req.files_owner;
    auto up = co_await agent.Write(ex, w);
    if (!up.ok()) co_return Annotate(up.status(), "copy files into the build sandbox");
    for (;;) {
      if (req.cancelled && req.cancelled()) {
        up->Abort();
        co_return absl::CancelledError("build step: cancelled");
      }
      auto piece = req.files();
      if (!piece.ok()) {
        up->Abort();
        co_return piece.status();
      }
      if (piece->empty()) break;
      absl::Status sent = co_await up->Send(*piece);
      if (!sent.ok()) co_return Annotate(sent, "copy files into the build sandbox");
    }
    auto end = co_await up->Finish();
    if (!end.ok()) co_return Annotate(end.status(), "copy files into the build sandbox");
  }
  // WORKDIR's directory, and a RUN's cwd (its WORKDIR, removed by a later step perhaps).
  const std::string dir = req.mkdir ? *req.mkdir : req.run ? req.run->cwd : "";
  if (!dir.empty() && dir != "/") {
    protocol::MkdirRequest m;
    m.path = dir;
    m.parents = true;
    auto made = co_await agent.Mkdir(ex, m);
    if (!made.ok() && ApiErrorCode(made.status()) != "already_exists") {
      co_return Annotate(made.status(), "make the WORKDIR " + dir);
    }
  }
  if (!req.run) co_return std::optional<std::string>();
  const protocol::SessionSpec& spec = *req.run;
  auto stream = co_await agent.Attach(ex, kBuildSession, 0, spec);
  if (!stream.ok()) co_return Annotate(stream.status(), "start the RUN");
  for (;;) {
    if (req.cancelled && req.cancelled()) {
      (void)co_await agent.Signal(ex, kBuildSession, SIGKILL);
      co_return absl::CancelledError("build step: cancelled");
    }
    auto frame = co_await stream->Next(kCancelPoll);
    if (!frame.ok()) co_return Annotate(frame.status(), "read the RUN's output");
    if (!frame->has_value()) continue;
    auto ev = (*frame)->Decode();
    if (!ev.ok()) co_return ev.status();
    if (ev->kind == AttachEvent::Kind::kOutput) {
      if (req.output) req.output(ev->output.data);
    } else if (ev->kind == AttachEvent::Kind::kExit) {
      std::string ending = Ending(ev->exit);
      co_return ending.empty() ? std::optional<std::string>() : std::optional<std::string>(ending);
    }
  }
}

}  // namespace

absl::StatusOr<BuildStepResult> SandboxService::RunBuildStep(const BuildStepRequest& req) {
  const std::string runtime_name = req.sandbox.runtime.value_or(BuildRuntime());
  SBX_ASSIGN_OR_RETURN(runtime::Backend * backend, BackendFor(runtime_name));
  if (!backend->GetCapabilities().template_builds) {
    return ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                    fmt::format("runtime '{}' cannot run a template build's RUN steps (it cannot "
                                "export a sandbox's writable layer); build on runtime 'ns'",
                                runtime_name),
                    "runtime");
  }
  if (!req.tenant_id.empty()) {
    SBX_RETURN_IF_ERROR(store_.Transact([&](store::Tx& tx) {
      return CheckEgressProfile(tx, req.tenant_id, req.sandbox.egress_profile);
    }));
  }
  SBX_ASSIGN_OR_RETURN(nlohmann::json egress, ResolveEgress(req.sandbox));
  runtime::SandboxSpec spec;
  spec.id = NewId("sbx");
  spec.tmpl = req.tmpl;
  spec.resources = EffectiveOf(req.sandbox, defaults());
  spec.hostname = "build";
  spec.egress = egress;
  spec.keep_writable_layer = true;
  SBX_RETURN_IF_ERROR(admission_->Admit(spec.id, DemandOf(spec.resources), "a template build step"));
  log::Context lctx;
  lctx.sandbox = spec.id;
  log::Scope scope(lctx);
  auto inst = backend->Create(spec);
  if (!inst.ok()) {
    admission_->Release(spec.id);
    return Annotate(inst.status(), "build step: create its sandbox");
  }
  auto result = [&]() -> absl::StatusOr<BuildStepResult> {
    asio::io_context ioc;
    absl::StatusOr<std::optional<std::string>> ran = absl::UnknownError("build step did not run");
    AgentClient agent = AgentClient::ForSocket((*inst)->AgentSocketPath());
    asio::co_spawn(
        ioc, [&]() -> asio::awaitable<void> { ran = co_await Drive(agent, req); },
        asio::detached);
    ioc.run();
    SBX_RETURN_IF_ERROR(ran.status());
    BuildStepResult out;
    out.failed = *ran;
    if (out.failed) return out;
    SBX_ASSIGN_OR_RETURN(out.layer, (*inst)->ExportWritableLayer(req.layer_fd, req.cancelled, req.max_entries));
    return out;
  }();
  absl::Status gone = (*inst)->Destroy();
  if (!gone.ok()) {
    spdlog::error("build step: destroy {}: {}", spec.id, std::string(gone.message()));
  } else {
    admission_->Release(spec.id);
  }
  return result;
}

}  // namespace sbx::service
