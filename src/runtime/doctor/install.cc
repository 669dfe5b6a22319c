// sbx's own pieces: agent.binary (the sbx-agent every sandbox runs as PID 1) and
// template.base (the caller resolves the template: the doctor does not link the service).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/unique_fd.h"
#include "runtime/doctor/checks.h"
#include "runtime/ns/agent_image.h"

namespace sbx::runtime::doctor {

namespace {

constexpr char kAgentRemedy[] =
    "build it (ninja -C build sbx-agent; it lands beside sbxd) or pass --agent-path";

void CheckAgent(const Context& ctx) {
  Check c{"agent.binary", "sbx-agent binary", CheckResult::kOk, "", "", true};
  const std::string& path = ctx.opts.agent_path;
  if (path.empty()) {
    c.result = CheckResult::kFail;
    c.detail = "no agent path configured";
    c.remedy = kAgentRemedy;
    ctx.Add(std::move(c));
    return;
  }
  const std::string host = ctx.Host(path);
  UniqueFd fd(::open(host.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  char magic[4] = {0, 0, 0, 0};
  if (!fd) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("open({}): {}", host, ErrnoText(errno));
    c.remedy = kAgentRemedy;
  } else if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("{} is not a regular file", host);
    c.remedy = kAgentRemedy;
  } else if (::pread(fd.get(), magic, 4, 0) != 4 || std::memcmp(magic, "\x7f" "ELF", 4) != 0) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("{} is not an ELF executable", host);
    c.remedy = kAgentRemedy;
  } else if (!ctx.ns && ::access(host.c_str(), X_OK) != 0) {
    // The fake runtime execs the file itself; the ns runtime execs a sealed copy (agent_image.h).
    c.result = CheckResult::kFail;
    c.detail = fmt::format("{} is not executable: access(X_OK): {}", host, ErrnoText(errno));
    c.remedy = fmt::format("chmod +x {}", path);
  } else if (ctx.ns && ctx.live && !ctx.opts.skip_backend_probes) {
    // What sbxd does at start: the sealed memfd every sandbox execs.
    auto image = ns::AgentImage::Load(path);
    if (!image.ok()) {
      c.result = CheckResult::kFail;
      c.detail = std::string(image.status().message());
      c.remedy = "see the error (memfd_create can be refused by vm.memfd_noexec=2 or a seccomp "
                 "profile around sbxd)";
    } else {
      c.detail = fmt::format("{}: ELF, {} bytes, loaded into a sealed memfd", path, image->size());
    }
  } else {
    c.detail = fmt::format("{}: ELF, {} bytes{}", host, static_cast<uint64_t>(st.st_size),
                           !ctx.ns ? ", executable"
                           : ctx.opts.skip_backend_probes && ctx.live
                               ? " (the sealed-memfd load is the ns backend's, right after)"
                               : "");
  }
  ctx.Add(std::move(c));
}

void CheckTemplate(const Context& ctx) {
  Check c{"template.base", "base template", CheckResult::kOk, "", "", true};
  if (!ctx.opts.template_check) {
    c.result = CheckResult::kSkip;
    c.detail = "not checked: no template resolver was supplied";
  } else if (absl::Status st = ctx.opts.template_check(); !st.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(st.message());
    c.remedy = "the state dir must be writable (the template's skeleton is built in "
               "<state>/templates/base) and the host's /usr and /etc must exist";
  } else {
    c.detail = "`base` resolves: its skeleton rootfs and every read-only view it mounts exist";
  }
  ctx.Add(std::move(c));
}

}  // namespace

void CheckInstall(const Context& ctx) {
  CheckAgent(ctx);
  CheckTemplate(ctx);
}

}  // namespace sbx::runtime::doctor
