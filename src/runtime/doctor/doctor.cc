#include "runtime/doctor/doctor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "runtime/doctor/checks.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/pidfd.h"

namespace sbx::runtime::doctor {

namespace {

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 60000));
}

void SleepMs(int ms) {
  struct timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Waits (bounded) for our child `pid` to end and reaps it; false when it is still running.
bool ReapBefore(pid_t pid, int pidfd, Clock::time_point deadline, int* wstatus) {
  for (;;) {
    pid_t r = ::waitpid(pid, wstatus, WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return true;  // ECHILD: reaped elsewhere; nothing to wait for
    const int left = MsLeft(deadline);
    if (left == 0) return false;
    if (pidfd >= 0) {
      struct pollfd p{pidfd, POLLIN, 0};
      ::poll(&p, 1, left);
    } else {
      SleepMs(std::min(left, 2));
    }
  }
}

const char* ResultCell(const Check& c) {
  switch (c.result) {
    case CheckResult::kOk: return "ok";
    case CheckResult::kWarn: return "warn";
    case CheckResult::kFail: return "FAIL";
    case CheckResult::kSkip: return "skip";
  }
  return "?";
}

const char* ResultColor(const Check& c) {
  switch (c.result) {
    case CheckResult::kOk: return "\x1b[32m";
    case CheckResult::kWarn: return "\x1b[33m";
    case CheckResult::kFail: return "\x1b[1;31m";
    case CheckResult::kSkip: return "\x1b[2m";
  }
  return "";
}

// Kernel and library messages may quote values with newlines ("write(uid_map, \"0 524288
// 65536\n\")"): the table keeps one logical line per cell.
std::string OneLine(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t' || ch == '\r') {
      out += ' ';
    } else {
      out += ch;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// A section that threw (a library's exception: our code throws none) becomes a failed row.
void RunSection(const Context& ctx, const char* name, void (*fn)(const Context&)) {
  try {
    fn(ctx);
  } catch (const std::exception& e) {
    ctx.Add(Check{fmt::format("{}.internal", name), fmt::format("{} checks", name),
                  CheckResult::kFail, fmt::format("the {} checks stopped with an error: {}", name, e.what()),
                  "report this as a bug of sbx doctor, with the output above", false});
  }
}

}  // namespace

const char* ResultName(CheckResult r) {
  switch (r) {
    case CheckResult::kOk: return "ok";
    case CheckResult::kWarn: return "warn";
    case CheckResult::kFail: return "fail";
    case CheckResult::kSkip: return "skip";
  }
  return "skip";
}

bool Report::ok() const {
  return std::none_of(checks.begin(), checks.end(), [](const Check& c) {
    return c.required && c.result == CheckResult::kFail;
  });
}

const Check* Report::Find(const std::string& id) const {
  for (const auto& c : checks) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

std::vector<Check> Report::RequiredFailures() const {
  std::vector<Check> out;
  for (const auto& c : checks) {
    if (c.required && c.result == CheckResult::kFail) out.push_back(c);
  }
  return out;
}

std::string Context::Host(const std::string& path) const {
  if (opts.host_root.empty() || opts.host_root == "/") return path;
  std::string root = opts.host_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return path.empty() || path[0] != '/' ? fmt::format("{}/{}", root, path) : root + path;
}

absl::StatusOr<std::string> Context::Read(const std::string& path) const {
  return ns::ReadFileToString(Host(path));
}

bool Context::Exists(const std::string& path) const {
  struct stat st;
  return ::lstat(Host(path).c_str(), &st) == 0;
}

void Context::AddNotProbed(std::string id, std::string title, bool required) const {
  Add(Check{std::move(id), std::move(title), CheckResult::kSkip,
            "not probed: fake host root (" + opts.host_root + ")", "", required});
}

std::string ErrnoText(int err) {
  const char* name = ::strerrorname_np(err);
  return fmt::format("{} ({})", name != nullptr ? name : fmt::format("errno {}", err), std::strerror(err));
}

absl::StatusOr<ChildOutcome> RunInChild(const std::function<void(int fd)>& body,
                                        std::chrono::milliseconds timeout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus(errno, "doctor probe: pipe2()");
  UniqueFd rd(fds[0]);
  UniqueFd wr(fds[1]);
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus(errno, "doctor probe: fork()");
  if (pid == 0) {
    ::close(fds[0]);
    body(fds[1]);
    ::_exit(0);
  }
  wr.Reset();
  const auto deadline = Clock::now() + timeout;
  UniqueFd pidfd(ns::PidfdOpen(pid));  // -1 before Linux 5.3: polled instead

  ChildOutcome out;
  char buf[4096];
  bool eof = false;
  while (!eof) {
    const int left = MsLeft(deadline);
    if (left == 0) break;
    struct pollfd p{rd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, left);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    ssize_t got = ::read(rd.get(), buf, sizeof(buf));
    if (got > 0) {
      if (out.output.size() < (1u << 20)) out.output.append(buf, static_cast<size_t>(got));
    } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
      eof = true;
    }
  }
  int wstatus = 0;
  if (!ReapBefore(pid, pidfd.get(), deadline, &wstatus)) {
    out.timed_out = true;
    ::kill(pid, SIGKILL);  // our unreaped child: the pid cannot have been reused
    if (!ReapBefore(pid, pidfd.get(), Clock::now() + std::chrono::seconds(2), &wstatus)) {
      // Stuck in the kernel (D state): leave it, the row says so.
      out.exited = false;
      out.signal = SIGKILL;
      return out;
    }
  }
  if (WIFEXITED(wstatus)) {
    out.exited = true;
    out.exit_code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    out.signal = WTERMSIG(wstatus);
  }
  return out;
}

std::string DescribeAbnormal(const ChildOutcome& o, std::chrono::milliseconds timeout) {
  if (o.timed_out) {
    return fmt::format("the probe process did not finish within {} ms and was killed", timeout.count());
  }
  if (!o.exited) {
    const char* abbrev = ::sigabbrev_np(o.signal);
    return fmt::format("the probe process was killed by signal {} (SIG{})", o.signal,
                       abbrev != nullptr ? abbrev : "?");
  }
  return "";
}

std::vector<std::string> WrapText(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  if (width == 0) {
    lines.push_back(text);
    return lines;
  }
  std::string line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(pos, end - pos);
    pos = end + 1;
    while (word.size() > width) {  // a path longer than a line: cut it
      if (!line.empty()) {
        lines.push_back(line);
        line.clear();
      }
      lines.push_back(word.substr(0, width));
      word = word.substr(width);
    }
    if (line.empty()) {
      line = word;
    } else if (line.size() + 1 + word.size() <= width) {
      line += ' ';
      line += word;
    } else {
      lines.push_back(line);
      line = word;
    }
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

Report RunDoctor(const DoctorOptions& options) {
  Report report;
  Context ctx{options, options.live && (options.host_root.empty() || options.host_root == "/"),
              options.runtime == "ns", options.runtime == "microvm", &report.checks};
  if (options.runtime != "ns" && options.runtime != "microvm" && options.runtime != "fake") {
    ctx.Add(Check{"doctor.runtime", "runtime", CheckResult::kFail,
                  fmt::format("unknown runtime \"{}\"", options.runtime),
                  "pick --runtime ns, --runtime microvm or --runtime fake", true});
    return report;
  }
  RunSection(ctx, "kernel", CheckKernel);
  RunSection(ctx, "namespace", CheckNamespaces);
  RunSection(ctx, "cgroup", CheckCgroups);
  RunSection(ctx, "fs", CheckFilesystems);
  RunSection(ctx, "security", CheckSecurity);
  RunSection(ctx, "network", CheckNetwork);
  RunSection(ctx, "device", CheckDevices);
  RunSection(ctx, "microvm", CheckMicrovm);
  RunSection(ctx, "storage", CheckStorage);
  RunSection(ctx, "install", CheckInstall);
  if (!options.only_required) RunSection(ctx, "limits", CheckDensity);
  // What the selected runtime does not need cannot stop it: its problems are warnings.
  for (auto& c : report.checks) {
    if (!c.required && c.result == CheckResult::kFail) c.result = CheckResult::kWarn;
  }
  return report;
}

std::string FormatTable(const Report& report, bool color, int width, bool verdict) {
  size_t id_w = 5;  // "CHECK"
  for (const auto& c : report.checks) id_w = std::max(id_w, c.id.size());
  constexpr size_t kResultW = 6;
  const size_t indent = id_w + 2 + kResultW + 2;
  const size_t text_w =
      width > 0 && static_cast<size_t>(width) > indent + 20 ? static_cast<size_t>(width) - indent : 0;
  const std::string pad(indent, ' ');
  std::string s = fmt::format("{:<{}}  {:<{}}  {}\n", "CHECK", id_w, "RESULT", kResultW, "DETAIL / WHAT TO DO");
  int counts[4] = {0, 0, 0, 0};
  for (const auto& c : report.checks) {
    ++counts[static_cast<int>(c.result)];
    const std::string cell = fmt::format("{:<{}}", ResultCell(c), kResultW);
    s += fmt::format("{:<{}}  {}  ", c.id, id_w, color ? fmt::format("{}{}\x1b[0m", ResultColor(c), cell) : cell);
    std::vector<std::string> lines = WrapText(OneLine(c.detail), text_w);
    for (size_t i = 0; i < lines.size(); ++i) s += (i == 0 ? "" : pad) + lines[i] + "\n";
    if (!c.remedy.empty() && c.result != CheckResult::kOk) {
      // Its continuation lines sit 5 columns further in, under the text after "fix: ".
      std::vector<std::string> fix = WrapText("fix: " + OneLine(c.remedy), text_w > 5 ? text_w - 5 : text_w);
      for (size_t i = 0; i < fix.size(); ++i) {
        s += pad + (i == 0 ? "" : "     ") + fix[i] + "\n";
      }
    }
  }
  if (!verdict) return s;
  std::vector<std::string> failed;
  for (const auto& c : report.RequiredFailures()) failed.push_back(c.id);
  const std::string counts_text = fmt::format("{} ok, {} warn, {} failed, {} skipped", counts[0],
                                              counts[1], counts[2], counts[3]);
  if (failed.empty()) {
    s += fmt::format("ready: no required check failed ({})\n", counts_text);
  } else {
    std::string ids;
    for (const auto& id : failed) ids += (ids.empty() ? "" : ", ") + id;
    s += fmt::format("NOT READY: {} required check(s) failed: {} ({})\n", failed.size(), ids, counts_text);
  }
  return s;
}

nlohmann::json ToJson(const Report& report) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : report.checks) {
    checks.push_back({{"id", c.id},
                      {"title", c.title},
                      {"result", ResultName(c.result)},
                      {"detail", c.detail},
                      {"remedy", c.remedy},
                      {"required", c.required}});
  }
  return nlohmann::json{{"ok", report.ok()}, {"checks", std::move(checks)}};
}

}  // namespace sbx::runtime::doctor
