#include "load/sysinfo.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "common/status_util.h"
#include "load/stats.h"

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

absl::StatusOr<PerfCounts> ParsePerfStatCsv(std::string_view text) {
  std::optional<double> clock_ms;
  std::optional<uint64_t> syscalls;
  for (std::string_view line : Split(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string_view> f = Split(line, ',');
    if (f.size() < 3) continue;
    bool is_clock = f[2] == "task-clock";
    bool is_sys = f[2].substr(0, 22) == "raw_syscalls:sys_enter";
    if (!is_clock && !is_sys) continue;
    // "<not counted>" or "<not supported>": the counter never ran.
    if (f[0].empty() || f[0][0] == '<') {
      return absl::UnavailableError(fmt::format("perf stat: {} {}", f[2], f[0]));
    }
    std::string v(f[0]);
    char* end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str()) {
      return absl::InvalidArgumentError(fmt::format("perf stat: {}: not a number: {}", f[2], v));
    }
    if (is_clock) {
      // perf prints task-clock in msec; say so rather than guess when a version differs.
      if (f[1] != "msec") {
        return absl::InvalidArgumentError(fmt::format("perf stat: task-clock in \"{}\"", f[1]));
      }
      clock_ms = d;
    } else {
      syscalls = static_cast<uint64_t>(d);
    }
  }
  if (!clock_ms || !syscalls) {
    return absl::NotFoundError("perf stat: no task-clock or raw_syscalls:sys_enter line");
  }
  return PerfCounts{*clock_ms, *syscalls};
}

absl::StatusOr<uint64_t> ParseProcStatBusyTicks(std::string_view proc_stat) {
  for (std::string_view line : Split(proc_stat, '\n')) {
    if (line.substr(0, 4) != "cpu ") continue;
    std::vector<uint64_t> v;
    for (std::string_view f : Split(line.substr(4), ' ')) {
      if (f.empty()) continue;
      v.push_back(std::strtoull(std::string(f).c_str(), nullptr, 10));
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice: inside user/nice]
    if (v.size() < 8) return absl::InvalidArgumentError("/proc/stat: short \"cpu \" line");
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  }
  return absl::NotFoundError("/proc/stat: no \"cpu \" line");
}

namespace {

std::optional<uint64_t> HostBusyTicks() {
  auto text = ReadFile("/proc/stat");
  if (!text.ok()) return std::nullopt;
  auto v = ParseProcStatBusyTicks(*text);
  if (!v.ok()) return std::nullopt;
  return *v;
}

}  // namespace

SbxdMeter::SbxdMeter(int sbxd_pid) : sbxd_pid_(sbxd_pid) {
  if (sbxd_pid <= 0) {
    error_ = "no --sbxd-pid";
    return;
  }
  char tmpl[] = "/tmp/sbx-load-perf.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    error_ = fmt::format("mkdtemp {}: errno {}", tmpl, errno);
    return;
  }
  dir_ = tmpl;
  const std::string ctl = dir_ + "/ctl", ack = dir_ + "/ack", out = dir_ + "/out",
                    log = dir_ + "/log";
  if (::mkfifo(ctl.c_str(), 0600) != 0 || ::mkfifo(ack.c_str(), 0600) != 0) {
    error_ = fmt::format("mkfifo in {}: errno {}", dir_, errno);
    return;
  }
  // Opened before perf starts and never at EOF while perf lives: perf writes "ack\n" into it.
  ack_fd_ = ::open(ack.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (ack_fd_ < 0) {
    error_ = fmt::format("open {}: errno {}", ack, errno);
    return;
  }
  const std::string pid = std::to_string(sbxd_pid);
  const std::string control = fmt::format("fifo:{},{}", ctl, ack);
  std::vector<std::string> args = {"perf", "stat", "-x", ",", "-e",
                                   "task-clock,raw_syscalls:sys_enter", "-D", "-1",
                                   "--control", control, "-p", pid, "-o", out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t child = -1;
  int rc = ::posix_spawnp(&child, "perf", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    error_ = fmt::format("spawn perf: errno {} (install linux-perf)", rc);
    return;
  }
  perf_pid_ = child;
  // perf opens the control FIFO once it has parsed its options; until then an O_NONBLOCK open
  // for writing fails with ENXIO.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (ctl_fd_ < 0) {
    ctl_fd_ = ::open(ctl.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (ctl_fd_ >= 0) break;
    int status = 0;
    if (::waitpid(perf_pid_, &status, WNOHANG) == perf_pid_) {
      perf_pid_ = -1;
      auto text = ReadFile(log);
      error_ = fmt::format("perf stat -p {} exited at start: {}", pid,
                           text.ok() ? text->substr(0, 300) : "(no log)");
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      error_ = "perf stat did not open its control FIFO within 15 s";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A no-op answered once perf has attached to every thread and reads its control FIFO.
  if (absl::Status s = Command("disable"); !s.ok()) error_ = std::string(s.message());
}

absl::Status SbxdMeter::Command(const char* cmd) {
  std::string line = fmt::format("{}\n", cmd);
  if (::write(ctl_fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return ErrnoStatus(errno, fmt::format("perf control: write \"{}\"", cmd));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  std::string got;
  while (got.find("ack\n") == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(fmt::format("perf control: no ack to \"{}\"", cmd));
    }
    pollfd p = {ack_fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) return ErrnoStatus(errno, "perf control: poll");
    if (n <= 0) continue;
    char buf[64];
    ssize_t r = ::read(ack_fd_, buf, sizeof(buf));
    if (r == 0) return absl::UnavailableError("perf control: perf closed its ack FIFO");
    if (r > 0) got.append(buf, static_cast<size_t>(r));
  }
  return absl::OkStatus();
}

void SbxdMeter::Begin() {
  if (!active()) return;
  if (absl::Status s = Command("enable"); !s.ok()) {
    error_ = std::string(s.message());
    return;
  }
  window_start_ticks_ = HostBusyTicks();
}

void SbxdMeter::End(double ops, double bytes) {
  if (!active()) return;
  std::optional<uint64_t> ticks = HostBusyTicks();
  if (absl::Status s = Command("disable"); !s.ok()) {
    error_ = std::string(s.message());
    return;
  }
  if (window_start_ticks_ && ticks) host_ticks_ += *ticks - *window_start_ticks_;
  window_start_ticks_.reset();
  ops_ += ops;
  bytes_ += bytes;
}

absl::StatusOr<PerfCounts> SbxdMeter::Stop() {
  if (perf_pid_ <= 0) return absl::FailedPreconditionError("perf is not running");
  if (ctl_fd_ >= 0) ::close(ctl_fd_);
  ctl_fd_ = -1;
  ::kill(perf_pid_, SIGINT);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::waitpid(perf_pid_, &status, WNOHANG) != perf_pid_) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(perf_pid_, SIGKILL);
      ::waitpid(perf_pid_, &status, 0);
      perf_pid_ = -1;
      return absl::DeadlineExceededError("perf stat did not stop within 10 s of SIGINT");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  perf_pid_ = -1;
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFile(dir_ + "/out"));
  return ParsePerfStatCsv(text);
}

void SbxdMeter::AddTo(nlohmann::json& extra) {
  if (!error_.empty()) {
    extra["cpu_unavailable"] = error_;
    return;
  }
  auto counts = Stop();
  if (!counts.ok()) {
    extra["cpu_unavailable"] = std::string(counts.status().message());
    return;
  }
  if (ops_ <= 0) {
    extra["cpu_unavailable"] = "no operation was metered";
    return;
  }
  extra["cpu_ms_per_op"] = Round(counts->task_clock_ms / ops_, 3);
  extra["syscalls_per_op"] = Round(static_cast<double>(counts->syscalls) / ops_, 1);
  if (bytes_ > 0) extra["cpu_ns_per_byte"] = Round(counts->task_clock_ms * 1e6 / bytes_, 3);
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (hz > 0) {
    extra["host_cpu_ms_per_op"] =
        Round(static_cast<double>(host_ticks_) * 1000.0 / static_cast<double>(hz) / ops_, 3);
  }
  extra["cpu_ops"] = ops_;
  extra["cpu_basis"] =
      "perf stat task-clock and raw_syscalls:sys_enter of sbxd and every process it started "
      "(holders, agents, commands), user + kernel, over a metered pass after the timed steps (up to 50 operations, one attach, a sustained window of up to 10 s: the tracepoint slows what it counts, so timed steps run unmetered); kernel threads "
      "not included (host_cpu_ms_per_op: all CPUs' busy time from /proc/stat over the same "
      "windows, kernel threads and any other load included)";
}

SbxdMeter::~SbxdMeter() {
  if (perf_pid_ > 0) (void)Stop();
  if (ctl_fd_ >= 0) ::close(ctl_fd_);
  if (ack_fd_ >= 0) ::close(ack_fd_);
  if (!dir_.empty()) {
    for (const char* f : {"/ctl", "/ack", "/out", "/log"}) ::unlink((dir_ + f).c_str());
    ::rmdir(dir_.c_str());
  }
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
