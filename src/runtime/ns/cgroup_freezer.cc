// The cgroup freezer: pause and wake of ns sandboxes, and the thaw that lets a killed frozen
// sandbox die.
//
// v2 (`cgroup.freeze`) is used wherever the sandbox has a v2 directory, which includes hybrid
// hosts like the project's machines: the unified hierarchy offers it without any controller
// (feasibility.md 2i: 9 tasks frozen in 3.7 ms). Completion is reported by the kernel through
// `cgroup.events` ("frozen 1"), which kernfs signals with POLLPRI, so waiting is event driven.
// The v1 freezer (`freezer.state`, feasibility.md 2f) serves v1-only hosts; it has no
// notification, so completion is polled with a short backoff, as WaitEmpty does for v1.
//
// What freezing does not do: release memory. A frozen sandbox keeps its pages resident (there
// is no usable CRIU on these hosts, feasibility.md §3), so "suspend" on the ns runtime is the
// same freeze as "pause".
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

using cgroup_internal::Join;

namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Waits until cgroup.events of `dir` shows "frozen <want>". The kernel marks cgroup.events
// modified (POLLPRI) when the frozen state changes; the 100 ms cap only bounds the cost of a
// notification lost between the read and the poll.
absl::Status WaitV2Frozen(const std::string& dir, bool want, Clock::time_point deadline) {
  const std::string events = Join(dir, "cgroup.events");
  UniqueFd fd(::open(events.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("wait for freezer: open({})", events));
  const char wanted = want ? '1' : '0';
  for (;;) {
    char buf[256];
    ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
    if (n < 0) return ErrnoStatus(errno, fmt::format("wait for freezer: read({})", events));
    buf[n] = '\0';
    const char* p = std::strstr(buf, "frozen ");
    if (p == nullptr) {
      return absl::FailedPreconditionError(fmt::format(
          "wait for freezer: {} has no \"frozen\" line (kernel older than 5.2?)", events));
    }
    if (p[7] == wanted) return absl::OkStatus();
    int ms = RemainingMs(deadline);
    if (ms == 0) {
      return absl::DeadlineExceededError(fmt::format("wait for freezer: {} still reads \"frozen {}\"",
                                                     events, p[7]));
    }
    struct pollfd pfd{fd.get(), POLLPRI, 0};
    if (::poll(&pfd, 1, std::min(ms, 100)) < 0 && errno != EINTR) {
      return ErrnoStatus(errno, fmt::format("wait for freezer: poll({})", events));
    }
  }
}

void SleepFor(std::chrono::microseconds d) {
  struct timespec ts{static_cast<time_t>(d.count() / 1000000),
                     static_cast<long>((d.count() % 1000000) * 1000)};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// v1: writing FROZEN starts the freeze; reading freezer.state re-checks the tasks and says
// FREEZING until every one has stopped. Writing FROZEN again retries tasks that could not be
// frozen yet (e.g. in an uninterruptible sleep).
absl::Status FreezeV1(const std::string& dir, Clock::time_point deadline) {
  const std::string state = Join(dir, "freezer.state");
  auto backoff = std::chrono::microseconds(100);
  for (;;) {
    SBX_RETURN_IF_ERROR(Annotate(WriteStringToFile(state, "FROZEN"), "freeze"));
    SBX_ASSIGN_OR_RETURN(std::string now, ReadFileToString(state));
    now = Trim(now);
    if (now == "FROZEN") return absl::OkStatus();
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format("freeze: {} still reads {}", state, now));
    }
    SleepFor(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
  }
}

}  // namespace

bool SandboxCgroup::CanFreeze() const {
  return std::any_of(dirs_.begin(), dirs_.end(),
                     [](const Dir& d) { return d.v2 || d.key == kFreezerKey; });
}

absl::Status SandboxCgroup::Freeze(Clock::time_point deadline) const {
  if (std::string v2 = v2_path(); !v2.empty()) {
    SBX_RETURN_IF_ERROR(
        Annotate(WriteStringToFile(Join(v2, "cgroup.freeze"), "1"), fmt::format("freeze {}", id_)));
    return Annotate(WaitV2Frozen(v2, true, deadline), fmt::format("freeze {}", id_));
  }
  for (const auto& d : dirs_) {
    if (d.key == kFreezerKey) return Annotate(FreezeV1(d.path, deadline), fmt::format("freeze {}", id_));
  }
  return absl::FailedPreconditionError(fmt::format(
      "freeze {}: the sandbox has neither a cgroup v2 directory nor a v1 freezer cgroup", id_));
}

absl::Status SandboxCgroup::Thaw(Clock::time_point deadline) const {
  if (std::string v2 = v2_path(); !v2.empty()) {
    SBX_RETURN_IF_ERROR(
        Annotate(WriteStringToFile(Join(v2, "cgroup.freeze"), "0"), fmt::format("thaw {}", id_)));
    return Annotate(WaitV2Frozen(v2, false, deadline), fmt::format("thaw {}", id_));
  }
  for (const auto& d : dirs_) {
    if (d.key != kFreezerKey) continue;
    // v1 thaws synchronously: the write wakes every task.
    return Annotate(WriteStringToFile(Join(d.path, "freezer.state"), "THAWED"),
                    fmt::format("thaw {}", id_));
  }
  return absl::FailedPreconditionError(fmt::format(
      "thaw {}: the sandbox has neither a cgroup v2 directory nor a v1 freezer cgroup", id_));
}

absl::StatusOr<bool> SandboxCgroup::FreezeRequested() const {
  if (std::string v2 = v2_path(); !v2.empty()) {
    auto text = ReadFileToString(Join(v2, "cgroup.freeze"));
    if (!text.ok()) return Annotate(text.status(), fmt::format("freezer state of {}", id_));
    return Trim(*text) == "1";
  }
  for (const auto& d : dirs_) {
    if (d.key != kFreezerKey) continue;
    auto text = ReadFileToString(Join(d.path, "freezer.state"));
    if (!text.ok()) return Annotate(text.status(), fmt::format("freezer state of {}", id_));
    return Trim(*text) != "THAWED";
  }
  return false;
}

void SandboxCgroup::ThawAfterKill() const {
  // Only the v1 freezer: a fatal signal wakes a task frozen by v2's cgroup.freeze (the kernel's
  // cgroup-v2.rst, "Processes in the frozen cgroup can be killed by a fatal signal"), so a v2
  // directory is removed frozen, without a stat and a write per Kill() (two per delete).
  for (const auto& d : dirs_) {
    if (!d.v2 && d.key == kFreezerKey) {
      (void)WriteStringToFile(Join(d.path, "freezer.state"), "THAWED");
    }
  }
}

}  // namespace sbx::runtime::ns
