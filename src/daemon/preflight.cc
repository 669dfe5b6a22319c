#include "daemon/preflight.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace sbx::daemon {

namespace {

runtime::doctor::DoctorOptions Options(const PreflightConfig& c) {
  runtime::doctor::DoctorOptions o;
  o.state_dir = c.state_dir;
  o.runtime = c.runtime;
  o.agent_path = c.agent_path;
  o.user_namespaces = c.user_namespaces;
  o.seccomp_policy_path = c.seccomp_policy_path;
  o.cgroup_parent = c.cgroup_parent;
  o.max_sandboxes = c.max_sandboxes;
  o.pooled = c.pooled;
  o.microvm_qemu = c.microvm_qemu;
  o.microvm_kernel = c.microvm_kernel;
  o.microvm_vmm = c.microvm_vmm;
  o.microvm_firecracker = c.microvm_firecracker;
  o.microvm_jailer = c.microvm_jailer;
  return o;
}

void WriteAll(FILE* f, const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

}  // namespace

int RunCheckCommand(const PreflightConfig& config, bool json) {
  runtime::doctor::DoctorOptions o = Options(config);
  const std::string state_dir = config.state_dir;
  o.template_check = [state_dir] { return service::CheckTemplateForDoctor(state_dir); };
  runtime::doctor::Report report = runtime::doctor::RunDoctor(o);
  if (json) {
    WriteAll(stdout, runtime::doctor::ToJson(report).dump(2, ' ', false,
                                                          nlohmann::json::error_handler_t::replace) + "\n");
  } else {
    WriteAll(stdout, runtime::doctor::FormatTable(report, ::isatty(STDOUT_FILENO) == 1));
  }
  return report.ok() ? 0 : 1;
}

absl::Status StartupPreflight(const PreflightConfig& config,
                              const service::TemplateRegistry& templates) {
  const auto t0 = std::chrono::steady_clock::now();
  runtime::doctor::DoctorOptions o = Options(config);
  o.only_required = true;
  o.skip_backend_probes = true;  // NsBackend's constructor and Probe() run them next
  o.template_check = [&templates] { return templates.Check("base"); };
  runtime::doctor::Report report = runtime::doctor::RunDoctor(o);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (report.ok()) {
    spdlog::info("preflight: {} required checks of the {} runtime passed in {:.1f} ms",
                 report.checks.size(), config.runtime, ms);
    return absl::OkStatus();
  }
  runtime::doctor::Report failed{report.RequiredFailures()};
  std::string ids;
  for (const auto& c : failed.checks) ids += (ids.empty() ? "" : ", ") + c.id;
  WriteAll(stderr, fmt::format("sbxd: the {} runtime cannot work with this host and these flags:\n{}",
                               config.runtime,
                               runtime::doctor::FormatTable(failed, ::isatty(STDERR_FILENO) == 1, 0,
                                                            /*verdict=*/false)));
  return absl::FailedPreconditionError(fmt::format(
      "host preflight failed: {} of {} required checks ({}); `sbxd --check` lists every check",
      failed.checks.size(), report.checks.size(), ids));
}

}  // namespace sbx::daemon
