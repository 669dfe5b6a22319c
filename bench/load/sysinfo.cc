#include "load/sysinfo.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::load {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t i = s.find(sep, start);
    out.push_back(s.substr(start, i == std::string_view::npos ? i : i - start));
    if (i == std::string_view::npos) return out;
    start = i + 1;
  }
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoStatus(errno, fmt::format("read {}: open", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<uint64_t> ParseKbField(std::string_view text, std::string_view field) {
  for (std::string_view line : Split(text, '\n')) {
    if (line.substr(0, field.size()) != field || line.size() <= field.size() ||
        line[field.size()] != ':') {
      continue;
    }
    std::string_view rest = line.substr(field.size() + 1);
    size_t b = rest.find_first_of("0123456789");
    if (b == std::string_view::npos) break;
    uint64_t v = 0;
    for (size_t i = b; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i) {
      v = v * 10 + static_cast<uint64_t>(rest[i] - '0');
    }
    return v * 1024;
  }
  return absl::NotFoundError(fmt::format("no \"{}:\" field", field));
}

absl::StatusOr<uint64_t> MemAvailableBytes() {
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFile("/proc/meminfo"));
  auto v = ParseKbField(text, "MemAvailable");
  if (!v.ok()) return Annotate(v.status(), "/proc/meminfo");
  return v;
}

absl::StatusOr<uint64_t> MeminfoBytes(std::string_view field) {
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFile("/proc/meminfo"));
  auto v = ParseKbField(text, field);
  if (!v.ok()) return Annotate(v.status(), "/proc/meminfo");
  return v;
}

absl::StatusOr<size_t> OpenFds(int pid) {
  std::error_code ec;
  size_t n = 0;
  for (std::filesystem::directory_iterator it(fmt::format("/proc/{}/fd", pid), ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  if (ec) return ErrnoStatus(ec.value(), fmt::format("density: list /proc/{}/fd", pid));
  return n;
}

absl::StatusOr<uint64_t> ProcessRssBytes(int pid) {
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFile(fmt::format("/proc/{}/status", pid)));
  auto v = ParseKbField(text, "VmRSS");
  if (!v.ok()) return Annotate(v.status(), fmt::format("/proc/{}/status", pid));
  return v;
}

absl::StatusOr<CgroupLine> ParseMemoryCgroupLine(std::string_view proc_cgroup) {
  std::optional<CgroupLine> v2;
  for (std::string_view line : Split(proc_cgroup, '\n')) {
    // "4:memory:/path", "2:cpu,cpuacct:/path", "0::/path"
    size_t a = line.find(':');
    size_t b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    std::string_view controllers = line.substr(a + 1, b - a - 1);
    std::string path(line.substr(b + 1));
    if (controllers.empty() && line.substr(0, a) == "0") {
      v2 = CgroupLine{path, true};
      continue;
    }
    for (std::string_view c : Split(controllers, ',')) {
      if (c == "memory") return CgroupLine{path, false};
    }
  }
  if (v2) return *v2;
  return absl::NotFoundError("no memory or cgroup v2 line in /proc/PID/cgroup");
}

CgroupMount FindV1MemoryMount(std::string_view mountinfo) {
  for (std::string_view line : Split(mountinfo, '\n')) {
    // id parent major:minor root mount_point options [optional...] - fstype source super_options
    size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    std::vector<std::string_view> pre = Split(line.substr(0, dash), ' ');
    std::vector<std::string_view> post = Split(line.substr(dash + 3), ' ');
    if (pre.size() < 5 || post.size() < 3 || post[0] != "cgroup") continue;
    for (std::string_view opt : Split(post[2], ',')) {
      if (opt == "memory") return CgroupMount{std::string(pre[4]), std::string(pre[3])};
    }
  }
  return {};
}

absl::StatusOr<MemoryCgroup> MemoryCgroupOf(int pid) {
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFile(fmt::format("/proc/{}/cgroup", pid)));
  auto line = ParseMemoryCgroupLine(text);
  if (!line.ok()) return Annotate(line.status(), fmt::format("memory cgroup of pid {}", pid));
  if (line->v2) {
    // Pure v2 only: on a hybrid host the v2 tree has no memory controller.
    if (::access("/sys/fs/cgroup/cgroup.controllers", R_OK) != 0) {
      return absl::FailedPreconditionError(fmt::format(
          "memory cgroup of pid {}: no v1 memory hierarchy and /sys/fs/cgroup is not cgroup v2",
          pid));
    }
    std::string dir = "/sys/fs/cgroup" + (line->path == "/" ? "" : line->path);
    return MemoryCgroup{dir, "memory.current"};
  }
  SBX_ASSIGN_OR_RETURN(std::string mountinfo, ReadFile("/proc/self/mountinfo"));
  CgroupMount m = FindV1MemoryMount(mountinfo);
  if (m.mount_point.empty()) {
    return absl::NotFoundError("memory cgroup: no v1 memory mount in /proc/self/mountinfo");
  }
  std::string rel = line->path;
  if (m.root != "/" && rel.rfind(m.root, 0) == 0) rel = rel.substr(m.root.size());
  if (rel == "/") rel.clear();
  return MemoryCgroup{m.mount_point + rel, "memory.usage_in_bytes"};
}

std::vector<int> CgroupPids(const std::string& dir) {
  std::vector<int> pids;
  std::ifstream in(dir + "/cgroup.procs");
  int pid;
  while (in >> pid) pids.push_back(pid);
  return pids;
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

std::string KernelRelease() {
  struct utsname u;
  if (::uname(&u) != 0) return "";
  return fmt::format("{} {} {}", u.sysname, u.release, u.machine);
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string GitCommit() {
  FILE* p = ::popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (p == nullptr) return "";
  char buf[64] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, p);
  ::pclose(p);
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace sbx::load
