// `sbx doctor`: the host preflight (runtime/doctor/doctor.h) run locally, without sbxd. The one
// command of the CLI that does not talk HTTP: it answers "why would sbxd fail here?".
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "cli/cli_common.h"
#include "runtime/doctor/doctor.h"
#include "service/templates.h"

namespace sbx::cli {
namespace {

struct DoctorFlags {
  bool json = false;
  std::string state_dir = "/var/lib/sbx";
  std::string runtime = "ns";
  std::string agent_path;
  bool userns = true;
  std::string cgroup_parent;
  int64_t max_sandboxes = 0;
  std::string vmm = "qemu";  // --vmm: runtime.microvm.vmm
  std::string firecracker = "firecracker";
  std::string jailer = "jailer";
  int64_t pooled = 10;   // --pooled: runtime.ns.netns_pool 4 + userns_pool 4 + disk_pool 2
};

// sbxd's own default: sbx-agent beside the binary (sbx, sbxd and sbx-agent are built together).
std::string AgentBesideSelf() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "sbx-agent";
  return (self.parent_path() / "sbx-agent").string();
}

int TerminalWidth() {
  struct winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

}  // namespace

void RegisterDoctorCommand(CLI::App& app, Context& ctx) {
  auto f = std::make_shared<DoctorFlags>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Check this host for what sbxd needs (run as root, on the sbxd host; exit 1 when a "
                "required check fails)");
  cmd->add_flag("--json", f->json, "print {\"ok\": bool, \"checks\": [...]} instead of the table");
  cmd->add_option("--state-dir", f->state_dir, "sbxd's state dir")->capture_default_str();
  cmd->add_option("--runtime", f->runtime, "the runtime whose requirements count: ns, microvm or fake")
      ->capture_default_str()
      ->check(CLI::IsMember({"ns", "microvm", "fake"}));
  cmd->add_option("--agent-path", f->agent_path, "sbx-agent binary (default: beside sbx)");
  cmd->add_option("--vmm", f->vmm, "as runtime.microvm.vmm: the VMM whose rows count (qemu or firecracker)")
      ->capture_default_str()
      ->check(CLI::IsMember({"qemu", "firecracker"}));
  cmd->add_option("--firecracker", f->firecracker, "as runtime.microvm.firecracker")->capture_default_str();
  cmd->add_option("--jailer", f->jailer, "as runtime.microvm.jailer")->capture_default_str();
  cmd->add_option("--userns", f->userns, "as sbxd --userns: whether user namespaces are required")
      ->capture_default_str();
  cmd->add_option("--cgroup-parent", f->cgroup_parent,
                  "as sbxd --cgroup-parent: where sandbox cgroups go (empty: <own cgroup>/sbx)");
  cmd->add_option("--max-sandboxes", f->max_sandboxes,
                  "as sbxd --max-sandboxes: the sandboxes the host must hold (the limits.* rows "
                  "warn per short limit; 0: report what it holds)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  cmd->add_option("--pooled", f->pooled,
                  "namespaces, uid ranges and disks sbxd's pools hold beside the sandboxes "
                  "(--netns-pool + --userns-pool + --disk-pool)")
      ->capture_default_str();
  cmd->callback([&ctx, f] {
    ctx.needs_client = false;
    ctx.action = [f](Client&) -> absl::StatusOr<int> {
      runtime::doctor::DoctorOptions o;
      o.state_dir = f->state_dir;
      o.runtime = f->runtime;
      o.agent_path = f->agent_path.empty() ? AgentBesideSelf() : f->agent_path;
      o.user_namespaces = f->userns;
      o.cgroup_parent = f->cgroup_parent;
      o.max_sandboxes = f->max_sandboxes;
      o.pooled = f->pooled;
      o.microvm_vmm = f->vmm;
      o.microvm_firecracker = f->firecracker;
      o.microvm_jailer = f->jailer;
      const std::string state_dir = f->state_dir;
      o.template_check = [state_dir] { return service::CheckTemplateForDoctor(state_dir); };
      runtime::doctor::Report report = runtime::doctor::RunDoctor(o);
      if (f->json) {
        PrintJson(runtime::doctor::ToJson(report));
      } else {
        const bool tty = ::isatty(STDOUT_FILENO) == 1;
        SBX_RETURN_IF_ERROR(
            WriteAll(STDOUT_FILENO, runtime::doctor::FormatTable(report, tty, tty ? TerminalWidth() : 0)));
      }
      return report.ok() ? 0 : kExitFailure;
    };
  });
}

}  // namespace sbx::cli
