// fs.overlay and fs.ext4 (the kernel's file systems list), fs.idmap (an idmapped clone of the
// state dir's mount, made with the runtime's own ProbeIdmap).
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/doctor/checks.h"
#include "runtime/ns/mounts.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::doctor {

namespace {

void CheckOverlay(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{"fs.overlay", "overlayfs", CheckResult::kOk, "", "", required};
  if (absl::Status st = ns::ProbeOverlayfs(ctx.Host("/proc")); !st.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(st.message());
    c.remedy = "modprobe overlay (and add it to /etc/modules-load.d/), or use a kernel with "
               "CONFIG_OVERLAY_FS=y";
  } else {
    c.detail = "overlay is in /proc/filesystems (the sandbox's root is an overlay on the template)";
  }
  ctx.Add(std::move(c));
}

void CheckExt4(const Context& ctx) {
  const bool required = ctx.ns;
  if (!ctx.Wants(required)) return;
  Check c{"fs.ext4", "ext4 (sandbox disks)", CheckResult::kOk, "", "", required};
  auto fs = ctx.Read("/proc/filesystems");
  if (!fs.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(fs.status().message());
    c.remedy = "mount /proc";
  } else if (fs->find("\text4\n") == std::string::npos) {
    c.result = CheckResult::kFail;
    c.detail = fmt::format("ext4 is not in {}: each sandbox's writable layer is an ext4 image "
                           "(its disk_mib cap)", ctx.Host("/proc/filesystems"));
    c.remedy = "modprobe ext4, or use a kernel with CONFIG_EXT4_FS";
  } else {
    c.detail = "ext4 is in /proc/filesystems (each sandbox's writable layer is an ext4 image)";
  }
  ctx.Add(std::move(c));
}

// The state dir, or its nearest existing ancestor (the file system it will be created on).
std::string ExistingDir(const std::string& path) {
  std::string p = path;
  struct stat st;
  while (!p.empty() && p != "/") {
    if (::stat(p.c_str(), &st) == 0) return p;
    size_t slash = p.rfind('/');
    p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
  }
  return "/";
}

void CheckIdmap(const Context& ctx) {
  const bool required = ctx.ns && ctx.opts.user_namespaces;
  if (!ctx.Wants(required)) return;
  if (!ctx.live) return ctx.AddNotProbed("fs.idmap", "idmapped mounts", required);
  if (ctx.opts.skip_backend_probes) {
    return ctx.Add(Check{"fs.idmap", "idmapped mounts", CheckResult::kSkip,
                         "left to the ns backend's own idmap probe, right after", "", required});
  }
  Check c{"fs.idmap", "idmapped mounts", CheckResult::kOk, "", "", required};
  const std::string sandboxes = ctx.opts.state_dir + "/sandboxes";
  const std::string dir = ExistingDir(sandboxes);
  if (absl::Status st = ns::ProbeIdmap(dir); !st.ok()) {
    c.result = CheckResult::kFail;
    c.detail = std::string(st.message());
    c.remedy = ::geteuid() != 0
                   ? "run as root (the probe builds a user namespace with a host uid range)"
                   : "put the state dir on ext4, xfs or btrfs (tmpfs needs Linux 6.3), or run sbxd "
                     "with --userns=false (weaker: sandbox root is then host root)";
    if (!ctx.opts.user_namespaces) c.detail += " (not needed: --userns=false)";
  } else {
    c.detail = fmt::format("an idmapped clone of {}'s mount was made and dropped", dir);
  }
  ctx.Add(std::move(c));
}

}  // namespace

void CheckFilesystems(const Context& ctx) {
  CheckOverlay(ctx);
  CheckExt4(ctx);
  CheckIdmap(ctx);
}

}  // namespace sbx::runtime::doctor
