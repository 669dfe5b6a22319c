// clone3 + the child's ordered pipeline + parent/child synchronisation.
//
// The parent (an sbxd worker thread, in a multi-threaded process) prepares a LaunchPlan holding
// every string, array and fd the child needs. After clone3 the child is a copy of one thread
// of a multi-threaded process: another thread may have held the malloc lock, a logger's mutex
// or anything else at that instant, so the child runs syscalls only, reads the plan, and
// reports a failure as a fixed-size ChildReport on a CLOEXEC pipe. A successful execveat
// closes the pipe, so the parent reads EOF.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "runtime/ns/caps.h"
#include "runtime/ns/child_report.h"
#include "runtime/ns/landlock.h"
#include "runtime/ns/mounts.h"
#include "runtime/ns/seccomp.h"

namespace sbx::runtime::ns {

inline constexpr int kAgentListenFd = 3;
// The sandbox memory cgroup's OOM counter file (read-only), when LaunchPlan::oom_fd is set.
inline constexpr int kAgentOomFd = 4;
// With LaunchPlan::agent_uid: the sandbox's user namespace, which the agent enters in every
// process it starts (it is not in it itself; src/agent/identity.h).
inline constexpr int kAgentUsernsFd = 5;
// LaunchPlan::agent_cgroup_fds become the agent's fds from here on.
inline constexpr int kAgentCgroupFdBase = 6;
inline constexpr size_t kMaxAgentCgroupFds = 8;

struct LaunchPlan {
  MountPlan mounts;
  // cgroup.procs files the child joins by writing "0" (v1 hierarchies).
  std::vector<int> cgroup_procs_fds;
  std::vector<std::string> cgroup_procs_paths;  // for messages
  // v2 directory for CLONE_INTO_CGROUP, -1 when not used.
  int cgroup_v2_dir_fd = -1;
  std::string cgroup_v2_path;  // for messages

  std::string hostname;
  // A network namespace built ahead with `lo` up (netns_pool.h), or -1: then clone3 makes a
  // fresh one and the child brings its `lo` up.
  int netns_fd = -1;
  int listen_fd = -1;  // becomes fd 3 of the agent
  int log_fd = -1;     // becomes stdout and stderr of the agent
  int agent_fd = -1;   // sealed memfd of sbx-agent
  int oom_fd = -1;     // becomes kAgentOomFd of the agent, or -1
  std::string agent_path;  // for messages

  // The sandbox's user namespace (userns.h), joined after the mounts; -1 = none (the agent
  // then runs as host root with the reduced capability set).
  int userns_fd = -1;
  // Nonzero (with userns_fd): the agent does not join the user namespace but stays in the
  // host's as this unprivileged uid/gid, which owns the namespace (userns.h AgentUidOf), with
  // no capabilities; the namespace becomes its fd kAgentUsernsFd. `seccomp` is then the
  // agent's own filter (SeccompFor::kAgent).
  uid_t agent_uid = 0;
  // cgroup.procs of the cgroups the agent's processes join (the split's work/, one per
  // hierarchy; cgroup.h CgroupLimits), opened here so that the agent may write them whatever
  // its credentials: fds kAgentCgroupFdBase.. of the agent.
  std::vector<int> agent_cgroup_fds;
  // The sandbox's disk as a detached mount (disk_image.h), or -1.
  int disk_fd = -1;
  // A new time namespace (CLONE_NEWTIME), owned by the host's user namespace. Its offsets stay
  // zero (the clocks read as the host's); what it buys is that nothing inside can ever set
  // offsets that other sandboxes or the host would see.
  bool new_time_ns = true;
  // RLIMIT_NOFILE (soft = hard) of every process in the sandbox; 0 keeps sbxd's.
  uint64_t nofile = 0;

  const CapsPlan* caps = nullptr;
  const SeccompProgram* seccomp = nullptr;
  const LandlockPlan* landlock = nullptr;  // null: no Landlock

  // Storage and the NULL-terminated arrays execveat gets.
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;

  // Optional profiling: when set (a MAP_SHARED page), the child stores CLOCK_MONOTONIC
  // timestamps (ns) of its milestones in it; see TraceSlot.
  uint64_t* trace = nullptr;

  // Fills argv/envp from the storage vectors (call after the last change to them).
  void FinalizeArrays();
};

// Milestones of the child recorded in LaunchPlan::trace.
enum TraceSlot : int {
  kTraceStart = 0,
  kTraceSignals,
  kTraceJoined,
  kTraceCgroupNs,
  kTraceMounts,
  kTracePivot,
  kTraceHostNet,
  kTraceStdio,
  kTraceCaps,
  kTraceSeccomp,
  kTraceExec,
  kTraceSlots,
};
static_assert(kTraceSlots <= kMountTraceFirst, "mount trace slots overlap the launcher's");

// The agent process, owned: the destructor SIGKILLs it (which, as PID 1 of its pid namespace,
// takes every process inside with it) and reaps it, unless Release() handed it over.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(pid_t pid, UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  int pidfd() const { return pidfd_.get(); }
  // Hands over ownership of the pidfd; the process is no longer killed by the destructor.
  UniqueFd Release();
  // SIGKILL + wait for exit + reap (when it is our child). Idempotent.
  void KillAndReap();

 private:
  pid_t pid_ = -1;
  UniqueFd pidfd_;
};

// Clones the child into new mount/pid/ipc/uts/net namespaces, runs the pipeline and waits until
// the agent was exec'd. On failure the child is reaped and the status names the failed step,
// its syscall and errno.
absl::StatusOr<ChildProcess> Launch(const LaunchPlan& plan);

// Syscalls every launch depends on, probed without side effects. FailedPrecondition naming
// the kernel that has them when they are missing.
//   clone3: Linux 5.3 (CLONE_INTO_CGROUP 5.7); close_range with CLOSE_RANGE_CLOEXEC: 5.11.
absl::Status ProbeClone3();
absl::Status ProbeCloseRangeCloexec();

// Turns a child's failure report into a Status naming the step (exposed for tests).
absl::Status DescribeChildFailure(const LaunchPlan& plan, const ChildReport& report);

// Waits (poll on the pidfd, bounded) until the process exited, then reaps it when it is our
// child. Returns false on timeout.
bool WaitPidfdExit(int pidfd, int timeout_ms);

}  // namespace sbx::runtime::ns
