// One step of a template build that changes files (RUN, COPY, ADD, WORKDIR: docs/templates.md,
// "Builds"), as TemplateService asks for it and SandboxService::RunBuildStep does it: a
// sandbox of the build's intermediate result, the step's command or files, then the sandbox's
// writable layer written out as an OCI layer tar. The sandbox is not in the store or the API;
// it is admitted like any other, named sbx_… so a crash's leftover goes in the start-up sweep,
// and destroyed before the call returns.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "protocol/messages.h"
#include "runtime/backend.h"
#include "service/inputs.h"

namespace sbx::service {

struct BuildStepRequest {
  runtime::TemplateSpec tmpl;     // the intermediate result the step runs on
  CreateSandboxRequest sandbox;   // resources and egress profile the build names
  std::string tenant_id;          // whose build: the egress profiles it may use apply
  // RUN: the process (argv, cwd, env, user, timeout); its cwd is made first if missing.
  std::optional<protocol::SessionSpec> run;
  // COPY/ADD: a tar stream unpacked at "/" (names relative to it), pieces until an empty one.
  std::function<absl::StatusOr<std::string_view>()> files;
  // COPY --chown: the owner of every entry `files` makes ("user[:group]", "uid[:gid]").
  std::string files_owner;
  // WORKDIR: a directory made (with its parents) if missing.
  std::optional<std::string> mkdir;
  // Each piece of the RUN's stdout and stderr as it comes.
  std::function<void(std::string_view)> output;
  std::function<bool()> cancelled;
  int layer_fd = -1;  // where the layer tar goes
  uint64_t max_entries = UINT64_MAX;  // of the layer (templates.max_entries_per_layer)
};

struct BuildStepResult {
  // Set when the RUN did not succeed: "exited with code 2", "killed by SIGKILL (out of memory)",
  // "timed out"; then no layer is written.
  std::optional<std::string> failed;
  runtime::ExportedLayer layer;
};

using BuildStepRunner = std::function<absl::StatusOr<BuildStepResult>(const BuildStepRequest&)>;

}  // namespace sbx::service
