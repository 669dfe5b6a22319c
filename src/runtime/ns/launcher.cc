#include "runtime/ns/launcher.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include "runtime/ns/pidfd.h"
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <optional>
#include <type_traits>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/ns/clone_vm.h"
#include "runtime/ns/netns.h"

namespace sbx::runtime::ns {

void LaunchPlan::FinalizeArrays() {
  argv.clear();
  envp.clear();
  for (auto& s : argv_storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
}

// ---------------------------------------------------------------------------------------------
// ChildProcess

ChildProcess::ChildProcess(ChildProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), pidfd_(std::move(o.pidfd_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    KillAndReap();
    pid_ = std::exchange(o.pid_, -1);
    pidfd_ = std::move(o.pidfd_);
  }
  return *this;
}

ChildProcess::~ChildProcess() { KillAndReap(); }

UniqueFd ChildProcess::Release() {
  pid_ = -1;
  return std::move(pidfd_);
}

void ChildProcess::KillAndReap() {
  if (!pidfd_) return;
  PidfdSendSignal(pidfd_.get(), SIGKILL);
  WaitPidfdExit(pidfd_.get(), 5000);
  pidfd_.Reset();
  pid_ = -1;
}

bool WaitPidfdExit(int pidfd, int timeout_ms) {
  struct pollfd pfd{pidfd, POLLIN, 0};
  for (;;) {
    int rc = ::poll(&pfd, 1, timeout_ms);
    if (rc > 0) break;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  // ECHILD: not our child (adopted after a restart) or already reaped; the exit is what counts.
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) != 0 &&
         errno == EINTR) {
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Child side: from clone3 to execveat. Syscalls only: no allocation, no locks, no logging, no
// exceptions.

namespace {

inline int Fail(ChildReport* r, Step step, int err, size_t index = 0) {
  r->step = static_cast<uint16_t>(step);
  r->index = static_cast<uint16_t>(index);
  r->err = err == 0 ? EIO : err;
  return r->err;
}

inline void Mark(const LaunchPlan& p, TraceSlot slot) {
  if (p.trace == nullptr) return;
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  p.trace[slot] = static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// Moves an fd above every slot InstallAgentFds and CompactFds fill, so that their dup2s cannot
// clobber it (the parent's fds may sit anywhere, including 0..3 in a process started with
// closed std fds).
inline constexpr int kLiftBase = 32;
static_assert(kLiftBase >= kAgentCgroupFdBase + static_cast<int>(kMaxAgentCgroupFds) + 3);
inline int Lift(int fd) { return ::fcntl(fd, F_DUPFD_CLOEXEC, kLiftBase); }

// The lowest fd the exec closes: everything above the agent's fixed fds.
inline unsigned FirstClosedFd(const LaunchPlan& p) {
  if (!p.agent_cgroup_fds.empty()) return static_cast<unsigned>(kAgentCgroupFdBase + p.agent_cgroup_fds.size());
  if (p.agent_uid != 0 && p.userns_fd >= 0) return kAgentUsernsFd + 1;
  return p.oom_fd >= 0 ? kAgentOomFd + 1 : kAgentListenFd + 1;
}

// The clone inherited the calling thread's signal mask (sbxd blocks signals in its workers)
// and ignored dispositions (SIGPIPE); both would pass through exec into every sandbox process.
// Dispositions first, then the mask: a signal pending or arriving in between must not run
// one of sbxd's handlers in this child (which may share sbxd's memory).
int ResetSignals(ChildReport* r) {
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::sigaction(sig, &dfl, nullptr);  // EINVAL for libc-reserved signals: nothing to reset
  }
  sigset_t empty;
  sigemptyset(&empty);
  if (::sigprocmask(SIG_SETMASK, &empty, nullptr) != 0) return Fail(r, Step::kSignals, errno);
  return 0;
}

int EnterSessionAndNetns(const LaunchPlan& p, ChildReport* r) {
  if (::setsid() < 0) return Fail(r, Step::kSetsid, errno);
  if (p.netns_fd >= 0 && ::setns(p.netns_fd, CLONE_NEWNET) != 0) return Fail(r, Step::kJoinNetns, errno);
  if (p.netns_fd < 0) {
    // A fresh namespace from clone3: set up here, while the host's /proc/sys is still
    // writable to this (host root) process.
    int stage = 0;
    if (int err = PrepareSandboxNetns(&stage); err != 0) return Fail(r, Step::kPrepareNetns, err, static_cast<size_t>(stage));
  }
  return 0;
}

// The plan's fds, lifted (Lift) so that the dup2s onto the agent's fixed slots cannot clobber
// them; on the child's stack.
struct LiftedFds {
  int sock = -1;
  int log = -1;
  int agent = -1;
  int oom = -1;
  // Used after the dup2s onto 0..5, which would replace it if it sat there.
  int userns = -1;
  int agent_cgroups[kMaxAgentCgroupFds];
};

int LiftFds(const LaunchPlan& p, int* report_fd, LiftedFds* f, ChildReport* r) {
  int rfd = Lift(*report_fd);
  if (rfd >= 0) *report_fd = rfd;
  f->sock = Lift(p.listen_fd);
  f->log = Lift(p.log_fd);
  f->agent = Lift(p.agent_fd);
  f->oom = p.oom_fd >= 0 ? Lift(p.oom_fd) : -1;
  f->userns = p.userns_fd >= 0 ? Lift(p.userns_fd) : -1;
  if (f->sock < 0 || f->log < 0 || f->agent < 0 || (p.oom_fd >= 0 && f->oom < 0) ||
      (p.userns_fd >= 0 && f->userns < 0) || p.agent_cgroup_fds.size() > kMaxAgentCgroupFds) {
    return Fail(r, Step::kStdio, errno);
  }
  for (size_t i = 0; i < p.agent_cgroup_fds.size(); ++i) {
    f->agent_cgroups[i] = Lift(p.agent_cgroup_fds[i]);
    if (f->agent_cgroups[i] < 0) return Fail(r, Step::kStdio, errno);
  }
  return 0;
}

int JoinCgroups(const LaunchPlan& p, ChildReport* r) {
  for (size_t i = 0; i < p.cgroup_procs_fds.size(); ++i) {
    if (::write(p.cgroup_procs_fds[i], "0", 1) != 1) return Fail(r, Step::kJoinCgroup, errno, i);
  }
  return 0;
}

// stdin /dev/null, stdout/stderr agent.log, and the agent's fixed fds (launcher.h).
int InstallAgentFds(const LaunchPlan& p, const LiftedFds& f, bool agent_outside, ChildReport* r) {
  // /dev/null of the sandbox (our node on the sandbox's /dev tmpfs).
  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) return Fail(r, Step::kStdio, errno, 0);
  if (::dup2(null_fd, 0) < 0) return Fail(r, Step::kStdio, errno, 1);
  if (::dup2(f.log, 1) < 0 || ::dup2(f.log, 2) < 0) return Fail(r, Step::kStdio, errno, 2);
  if (::dup2(f.sock, kAgentListenFd) < 0) return Fail(r, Step::kStdio, errno, 3);
  if (f.oom >= 0 && ::dup2(f.oom, kAgentOomFd) < 0) return Fail(r, Step::kStdio, errno, 4);
  // Fixed slots left unused sit below the close_range: nothing of sbxd's may stay there.
  if (f.oom < 0) ::close(kAgentOomFd);
  if (agent_outside) {
    if (::dup2(f.userns, kAgentUsernsFd) < 0) return Fail(r, Step::kStdio, errno, 5);
  } else {
    ::close(kAgentUsernsFd);
  }
  for (size_t i = 0; i < p.agent_cgroup_fds.size(); ++i) {
    if (::dup2(f.agent_cgroups[i], kAgentCgroupFdBase + static_cast<int>(i)) < 0) {
      return Fail(r, Step::kStdio, errno, 5);
    }
  }
  return 0;
}

// The clone copied sbxd's whole descriptor table: a pidfd per running sandbox, sockets. Once
// the agent's fds sit in their slots, the three this child still uses move just above them
// and every other one is closed. Otherwise, on a host running more sandboxes than a
// sandbox's RLIMIT_NOFILE, every fd the child opens after LowerLimits (Landlock's ruleset)
// would fail with EMFILE: the lowest free fd would lie above the limit.
int CompactFds(const LaunchPlan& p, int* report_fd, LiftedFds* f, ChildReport* r) {
  int next = static_cast<int>(FirstClosedFd(p));
  for (int* fd : {report_fd, &f->agent, &f->userns}) {
    if (*fd < 0) continue;
    if (::dup3(*fd, next, O_CLOEXEC) < 0) return Fail(r, Step::kCloseRange, errno, 0);
    *fd = next++;
  }
  if (::close_range(static_cast<unsigned>(next), ~0U, 0) != 0) return Fail(r, Step::kCloseRange, errno, 1);
  return 0;
}

// Lowering limits needs no privilege, so sandbox root (not host root, below) cannot raise
// them again. No core files: a crash inside must not write outside the sandbox's limits.
int LowerLimits(const LaunchPlan& p, ChildReport* r) {
  if (p.nofile != 0) {
    struct rlimit rl{p.nofile, p.nofile};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return Fail(r, Step::kRlimit, errno, 0);
  }
  struct rlimit no_core{0, 0};
  if (::setrlimit(RLIMIT_CORE, &no_core) != 0) return Fail(r, Step::kRlimit, errno, 1);
  return 0;
}

// The agent stays in the host's user namespace as the unprivileged owner of the sandbox's
// (userns.h): the bounding set is cut while this is still root (it needs CAP_SETPCAP), and
// the switch to a nonzero uid then clears every capability the agent had.
int BecomeNamespaceOwner(const LaunchPlan& p, ChildReport* r) {
  Mark(p, kTraceStdio);
  if (int err = DropBoundingCaps(*p.caps); err != 0) return Fail(r, Step::kCapsBounding, err);
  if (::syscall(SYS_setgroups, 0, nullptr) != 0) return Fail(r, Step::kSetgroups, errno);
  if (::syscall(SYS_setresgid, p.agent_uid, p.agent_uid, p.agent_uid) != 0) return Fail(r, Step::kSetresgid, errno);
  if (::syscall(SYS_setresuid, p.agent_uid, p.agent_uid, p.agent_uid) != 0) return Fail(r, Step::kSetresuid, errno);
  // The uid change cleared permitted and effective; inheritable and ambient go too.
  if (int err = ClearCaps(); err != 0) return Fail(r, Step::kCapset, err);
  Mark(p, kTraceCaps);
  return 0;
}

// setns gives full capabilities inside the new namespace; the ids are still host root's
// (unmapped there), so switch to the namespace's root, which the kernel maps to the sandbox's
// host uid range. The reduced capability set follows.
int BecomeSandboxRoot(const LaunchPlan& p, int userns, ChildReport* r) {
  if (userns >= 0) {
    if (::setns(userns, CLONE_NEWUSER) != 0) return Fail(r, Step::kJoinUserns, errno);
    if (::syscall(SYS_setgroups, 0, nullptr) != 0) return Fail(r, Step::kSetgroups, errno);
    // The raw syscalls: glibc's wrappers would signal every thread of the process (it has one).
    if (::syscall(SYS_setresgid, 0, 0, 0) != 0) return Fail(r, Step::kSetresgid, errno);
    if (::syscall(SYS_setresuid, 0, 0, 0) != 0) return Fail(r, Step::kSetresuid, errno);
  }
  Mark(p, kTraceStdio);
  int cap_step = 0;
  if (int err = ApplyCaps(*p.caps, &cap_step); err != 0) {
    return Fail(r, cap_step == 0 ? Step::kCapsBounding : cap_step == 1 ? Step::kCapsAmbient : Step::kCapset, err);
  }
  Mark(p, kTraceCaps);
  return 0;
}

int LockDown(const LaunchPlan& p, ChildReport* r) {
  // Required to install seccomp without CAP_SYS_ADMIN, and it stops setuid/file-capability
  // binaries from regaining what was just dropped.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Fail(r, Step::kNoNewPrivs, errno);
  // Before seccomp, whose filter need not allow the landlock_* syscalls of the launcher.
  if (p.landlock != nullptr) {
    if (int err = ApplyLandlock(*p.landlock); err != 0) return Fail(r, Step::kLandlock, err);
  }
  if (int err = InstallSeccomp(*p.seccomp); err != 0) return Fail(r, Step::kSeccomp, err);
  return 0;
}

// Where the detaching helper runs (Launch maps it; unused without kCloneSharesVm).
struct HelperStack {
  void* base = nullptr;
  size_t size = 0;
};

inline void WriteReport(int fd, const ChildReport& r) {
  ssize_t n;
  do {
    n = ::write(fd, &r, sizeof(r));
  } while (n < 0 && errno == EINTR);
}

// The helper's whole life: the detach, and a report if it failed. `raw` is the report fd.
int DetachEntry(void* raw) {
  ChildReport r;
  if (DetachOldRoot(&r) != 0) {
    WriteReport(static_cast<int>(reinterpret_cast<intptr_t>(raw)), r);
    return 127;
  }
  return 0;
}

// Step 27's detach of the host's tree waits for an RCU grace period (namespace_unlock), the
// longest wait of a launch under load. A helper that shares this child's namespaces and working
// directory (the new root) does it while this child carries on to its exec. The helper holds
// the report pipe too, so the parent's read ends (EOF) only once both the exec has happened and
// the helper has exited after a successful detach: sbxd neither answers the create nor talks to
// the agent, so no sandbox process can exist, before the host's tree is gone. The helper is PID 2
// of the sandbox and the agent reaps it. If it cannot be cloned, the detach is done here.
int DetachOldRootInParallel(int report_fd, const HelperStack& st, ChildReport* r) {
  struct clone_args args;
  std::memset(&args, 0, sizeof(args));
  args.exit_signal = SIGCHLD;
  if constexpr (kCloneSharesVm) {
    if (st.base == nullptr) return DetachOldRoot(r);
    args.flags = CLONE_VM;
    args.stack = reinterpret_cast<uint64_t>(st.base);
    args.stack_size = st.size;
  }
  if (CloneRun(&args, DetachEntry, reinterpret_cast<void*>(static_cast<intptr_t>(report_fd))) < 0) {
    return DetachOldRoot(r);
  }
  return 0;
}

// The child's steps in order (docs/isolation.md §3). Each returns 0 or the errno it reported.
int RunChild(const LaunchPlan& p, int* report_fd, const HelperStack& helper, ChildReport* r) {
  Mark(p, kTraceStart);
  ::umask(0);
  if (int err = ResetSignals(r); err != 0) return err;
  if (int err = EnterSessionAndNetns(p, r); err != 0) return err;
  Mark(p, kTraceSignals);
  LiftedFds fds;
  if (int err = LiftFds(p, report_fd, &fds, r); err != 0) return err;
  if (int err = JoinCgroups(p, r); err != 0) return err;
  Mark(p, kTraceJoined);
  // After joining: the namespace's root is then the sandbox's own cgroup in every hierarchy.
  if (::unshare(CLONE_NEWCGROUP) != 0) return Fail(r, Step::kUnshareCgroupNs, errno);
  Mark(p, kTraceCgroupNs);
  if (int err = SetupMounts(p.mounts, fds.userns, p.disk_fd, r); err != 0) return err;
  Mark(p, kTraceMounts);
  if (int err = PivotRoot(p.mounts, r); err != 0) return err;
  if (int err = DetachOldRootInParallel(*report_fd, helper, r); err != 0) return err;
  if (::chdir("/") != 0) return Fail(r, Step::kChdirNewRoot, errno);
  Mark(p, kTracePivot);
  if (::sethostname(p.hostname.c_str(), p.hostname.size()) != 0) return Fail(r, Step::kSethostname, errno);
  Mark(p, kTraceHostNet);
  const bool agent_outside = p.agent_uid != 0 && p.userns_fd >= 0;
  if (int err = InstallAgentFds(p, fds, agent_outside, r); err != 0) return err;
  if (int err = CompactFds(p, report_fd, &fds, r); err != 0) return err;
  if (int err = LowerLimits(p, r); err != 0) return err;
  // Last of the steps that need host root: everything mounted, named and joined above stays
  // owned by the host's user namespace, out of reach of sandbox root.
  if (int err = agent_outside ? BecomeNamespaceOwner(p, r) : BecomeSandboxRoot(p, fds.userns, r); err != 0) {
    return err;
  }
  if (int err = LockDown(p, r); err != 0) return err;
  // Everything above fd 3 (the report pipe, the memfd, fds other threads opened concurrently
  // without O_CLOEXEC) is closed by the exec itself; the memfd must survive until then.
  Mark(p, kTraceSeccomp);
  const unsigned first_closed = FirstClosedFd(p);
  if (::close_range(first_closed, ~0U, CLOSE_RANGE_CLOEXEC) != 0) return Fail(r, Step::kCloseRange, errno, 2);
  ::umask(022);
  Mark(p, kTraceExec);
  ::execveat(fds.agent, "", p.argv.data(), p.envp.data(), AT_EMPTY_PATH);
  return Fail(r, Step::kExec, errno);
}

[[noreturn]] void ChildMain(const LaunchPlan& p, int report_fd, const HelperStack& helper) {
  ChildReport r;
  RunChild(p, &report_fd, helper, &r);
  WriteReport(report_fd, r);
  ::_exit(127);
}

struct ChildArgs {
  const LaunchPlan* plan;
  int report_fd;
  HelperStack helper;
};

int ChildEntry(void* raw) {
  auto* a = static_cast<ChildArgs*>(raw);
  ChildMain(*a->plan, a->report_fd, a->helper);
}

// The child shares sbxd's memory until its execveat (posix_spawn's model, clone_vm.h): clone3
// then copies no page tables and the exec tears none down, which on these VMs is most of a
// launch's clone and exec time. CLONE_VFORK keeps this thread (and the child's stack and plan)
// still until the child has exec'd or exited; the child writes nothing but its own stack, the
// report pipe and the trace page.
constexpr size_t kChildStackBytes = 256 << 10;
// The detaching helper only calls umount2 (and write on failure): one page above the guard.
constexpr size_t kHelperStackBytes = 16 << 10;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parent side

absl::Status DescribeChildFailure(const LaunchPlan& p, const ChildReport& r) {
  const auto& m = p.mounts;
  const size_t i = r.index;
  auto at = [](const auto& v, size_t idx) -> std::string {
    if constexpr (std::is_same_v<std::decay_t<decltype(v[0])>, std::string>) {
      return idx < v.size() ? v[idx] : std::string("?");
    } else {
      return idx < v.size() ? v[idx].path : std::string("?");
    }
  };
  std::string what;
  switch (static_cast<Step>(r.step)) {
    case Step::kNone:
      what = "launch: unknown step";
      break;
    case Step::kSignals:
      what = "reset signals: sigprocmask(SIG_SETMASK, {})";
      break;
    case Step::kSetsid:
      what = "new session: setsid()";
      break;
    case Step::kJoinCgroup:
      what = fmt::format("join cgroup: write({}, \"0\")", at(p.cgroup_procs_paths, i));
      break;
    case Step::kUnshareCgroupNs:
      what = "cgroup namespace: unshare(CLONE_NEWCGROUP)";
      break;
    case Step::kMakeRootPrivate:
      what = "make / private: mount(/, MS_REC|MS_PRIVATE)";
      break;
    case Step::kMountDisk:
      what = fmt::format("mount disk: move_mount(disk -> {})", m.disk);
      break;
    case Step::kIdmapLower:
      what = fmt::format("idmapped lower: {}({} -> {})",
                         i == 0   ? "open_tree"
                         : i == 1 ? "mount_setattr(MOUNT_ATTR_IDMAP)"
                         : i == 2 ? "move_mount"
                                  : "mkdir",
                         m.lower_source, m.lower);
      if (r.err == EINVAL && i == 1) {
        what += " (the file system of the template cannot be idmapped: needs Linux 5.12+ and "
                "ext4, xfs, btrfs or tmpfs on 6.3+)";
      }
      break;
    case Step::kImageLayer: {
      const size_t layer = i / 4, stage = i % 4;
      const MountPlan::Layer* l = layer < m.image_layers.size() ? &m.image_layers[layer] : nullptr;
      what = fmt::format("image layer {}: {}({} -> {})", layer,
                         stage == 0   ? "open_tree"
                         : stage == 1 ? "mount_setattr(MOUNT_ATTR_IDMAP)"
                         : stage == 2 ? "move_mount"
                                      : "mkdir",
                         l ? l->source : "?", l ? l->target : "?");
      break;
    }
    case Step::kMaskDir:
      what = fmt::format("mask directory: {}({})", i == 0 ? "mkdir" : "open(O_PATH)", m.mask_dir);
      break;
    case Step::kMountOverlay:
      what = fmt::format("mount overlay: mount(overlay -> {}, {})", m.rootfs, m.overlay_data);
      break;
    case Step::kBindMkdir:
    case Step::kBindMount:
    case Step::kBindSetattr:
    case Step::kBindView:
    case Step::kBindMove: {
      if (i >= m.binds.size()) {
        what = "bind: ?";
        break;
      }
      const auto& b = m.binds[i];
      if (static_cast<Step>(r.step) == Step::kBindMkdir) {
        what = fmt::format("bind {}: create mount point {}", b.sandbox_path, b.target);
      } else if (static_cast<Step>(r.step) == Step::kBindMount) {
        what = fmt::format("bind {}: open_tree({}, OPEN_TREE_CLONE)", b.sandbox_path,
                           b.mask ? m.mask_dir : b.shared ? b.shared_path : b.source);
      } else if (static_cast<Step>(r.step) == Step::kBindSetattr) {
        what = fmt::format("bind {}: mount_setattr({}IDMAP|NOSUID|NODEV)", b.sandbox_path,
                           b.read_only ? "RDONLY|" : "");
      } else if (static_cast<Step>(r.step) == Step::kBindView) {
        what = b.shared
                   ? fmt::format("bind {}: mount(overlay -> {}, {}) (the shared view of {})", b.sandbox_path,
                                 m.shared_view, m.shared_view_overlay, m.shared_view_source)
                   : fmt::format("bind {}: mount(overlay -> {}, {})", b.sandbox_path, b.target, b.view_overlay);
      } else {
        what = fmt::format("bind {}: move_mount(-> {})", b.sandbox_path, b.stage.empty() ? b.target : b.stage);
      }
      break;
    }
    case Step::kMkdirMountpoint:
      what = fmt::format("mount point: mkdir({})", i == 0 ? m.proc : i == 1 ? m.dev : m.tmp);
      break;
    case Step::kMountProc:
      what = fmt::format("mount proc: mount(proc -> {})", m.proc);
      break;
    case Step::kMountDev:
      what = fmt::format("mount /dev: mount(tmpfs -> {}, {})", m.dev, m.dev_data);
      break;
    case Step::kMknod:
      what = fmt::format("populate /dev: mknod({})", at(m.nodes, i));
      break;
    case Step::kSymlink:
      what = fmt::format("populate /dev: symlink({})", at(m.links, i));
      break;
    case Step::kMountDevpts:
      what = fmt::format("mount /dev/pts: mount(devpts -> {}, {})", m.dev_pts, m.devpts_data);
      break;
    case Step::kMountShm:
      what = fmt::format("mount /dev/shm: mount(tmpfs -> {}, {})", m.dev_shm, m.shm_data);
      break;
    case Step::kMaskProc:
      what = fmt::format("mask /proc: clone of {} or bind of /dev/null -> {}", m.mask_dir, at(m.masked, i));
      break;
    case Step::kReadonlyProc:
      what = fmt::format("read-only /proc: mount({}, MS_BIND|MS_REMOUNT|MS_RDONLY)", at(m.read_only, i));
      break;
    case Step::kMountTmp:
      what = fmt::format("mount /tmp: mount(tmpfs -> {}, {})", m.tmp, m.tmp_data);
      break;
    case Step::kChdirRootfs:
      what = fmt::format("pivot root: chdir({})", m.rootfs);
      break;
    case Step::kPivotRoot:
      what = fmt::format("pivot root: pivot_root(., .) in {}", m.rootfs);
      break;
    case Step::kDetachOldRoot:
      what = "pivot root: umount2(old root, MNT_DETACH)";
      break;
    case Step::kChdirNewRoot:
      what = "pivot root: chdir(/)";
      break;
    case Step::kSethostname:
      what = fmt::format("set hostname: sethostname({})", p.hostname);
      break;
    case Step::kJoinNetns:
      what = "network namespace: setns(pooled netns fd, CLONE_NEWNET)";
      break;
    case Step::kPrepareNetns:
      what = i == 0 ? "network namespace: ioctl(lo, SIOCSIFFLAGS, IFF_UP)"
                    : "network namespace: write(/proc/sys/net/ipv4/ip_unprivileged_port_start, 0)";
      break;
    case Step::kStdio:
      what = fmt::format("agent fds: {}",
                         i == 0 ? "open(/dev/null)" : i == 1 ? "dup2(/dev/null, 0)"
                                  : i == 2 ? "dup2(agent.log, 1/2)"
                                  : i == 3 ? "dup2(socket, 3)" : i == 4 ? "dup2(oom counter, 4)"
                                  : "dup2(user namespace, 5) / dup2(work cgroups, 6..)");
      break;
    case Step::kRlimit:
      what = i == 0 ? fmt::format("limits: setrlimit(RLIMIT_NOFILE, {})", p.nofile)
                    : std::string("limits: setrlimit(RLIMIT_CORE, 0)");
      break;
    case Step::kJoinUserns:
      what = "user namespace: setns(userns fd, CLONE_NEWUSER)";
      break;
    case Step::kSetgroups:
      what = "user namespace: setgroups(0, NULL)";
      break;
    case Step::kSetresgid:
      what = p.agent_uid != 0 ? fmt::format("agent identity: setresgid({0}, {0}, {0})", p.agent_uid)
                              : std::string("user namespace: setresgid(0, 0, 0)");
      break;
    case Step::kSetresuid:
      what = p.agent_uid != 0 ? fmt::format("agent identity: setresuid({0}, {0}, {0})", p.agent_uid)
                              : std::string("user namespace: setresuid(0, 0, 0)");
      break;
    case Step::kCapsBounding:
      what = "capabilities: prctl(PR_CAPBSET_DROP)";
      break;
    case Step::kCapsAmbient:
      what = "capabilities: prctl(PR_CAP_AMBIENT_CLEAR_ALL)";
      break;
    case Step::kCapset:
      what = "capabilities: capset()";
      break;
    case Step::kNoNewPrivs:
      what = "no_new_privs: prctl(PR_SET_NO_NEW_PRIVS)";
      break;
    case Step::kLandlock:
      what = fmt::format("landlock: landlock_create_ruleset/add_rule(\"/\")/restrict_self ({})",
                         p.landlock != nullptr ? DescribeLandlockPlan(*p.landlock) : "no plan");
      break;
    case Step::kSeccomp:
      what = "seccomp: prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)";
      break;
    case Step::kCloseRange:
      what = r.index == 0   ? std::string("close fds: dup3 of the child's own fds above the agent's")
             : r.index == 1 ? std::string("close fds: close_range of sbxd's inherited fds")
                            : fmt::format("close fds: close_range({}, ~0, CLOSE_RANGE_CLOEXEC)", FirstClosedFd(p));
      break;
    case Step::kExec:
      what = fmt::format("exec agent: execveat(memfd of {}, AT_EMPTY_PATH)", p.agent_path);
      break;
  }
  return ErrnoStatus(r.err, what);
}

absl::Status ProbeClone3() {
  // clone3(NULL, 0): ENOSYS without clone3, EINVAL/EFAULT with it; nothing is created.
  if (::syscall(SYS_clone3, nullptr, 0) < 0 && errno == ENOSYS) {
    return absl::FailedPreconditionError(
        "clone3 is not available (ENOSYS): the ns runtime needs Linux 5.11 or newer");
  }
  return absl::OkStatus();
}

absl::Status ProbeCloseRangeCloexec() {
  // An empty range far above any open fd: only the flag's support is tested.
  if (::close_range(INT_MAX - 1, INT_MAX - 1, CLOSE_RANGE_CLOEXEC) != 0) {
    return ErrnoStatus(errno,
                       "close_range(CLOSE_RANGE_CLOEXEC) is not available (the ns runtime needs "
                       "Linux 5.11 or newer)");
  }
  return absl::OkStatus();
}

absl::StatusOr<ChildProcess> Launch(const LaunchPlan& plan) {
  if (plan.caps == nullptr || plan.seccomp == nullptr || plan.argv.empty() || plan.envp.empty()) {
    return absl::InternalError("launch: incomplete plan");
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus(errno, "launch: pipe2(sync pipe)");
  UniqueFd rd(fds[0]);
  UniqueFd wr(fds[1]);

  int pidfd = -1;
  struct clone_args args;
  std::memset(&args, 0, sizeof(args));
  // No CLONE_NEWUSER: the child joins the sandbox's user namespace by setns() at the end, so
  // these namespaces belong to the host's. With CLONE_VM the child itself stays in our time
  // namespace; its execveat moves it into the new one (exec_task_namespaces, Linux 6.0+).
  args.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD;
  if (plan.netns_fd < 0) args.flags |= CLONE_NEWNET;
  if (plan.new_time_ns) args.flags |= CLONE_NEWTIME;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  if (plan.cgroup_v2_dir_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(plan.cgroup_v2_dir_fd);
  }
  // Both unmapped only after `child` below is gone: on success the pipe's EOF means both the
  // child and the detaching helper are done with them; on failure ~ChildProcess kills and reaps
  // the child, and the kernel reaps the rest of its pid namespace (the helper) first.
  std::optional<ChildStack> stack;
  std::optional<ChildStack> helper_stack;
  HelperStack helper;
  if constexpr (kCloneSharesVm) {
    SBX_ASSIGN_OR_RETURN(ChildStack st, ChildStack::Make(kChildStackBytes));
    stack.emplace(std::move(st));
    args.flags |= CLONE_VM | CLONE_VFORK;
    args.stack = reinterpret_cast<uint64_t>(stack->base());
    args.stack_size = stack->size();
    SBX_ASSIGN_OR_RETURN(ChildStack hs, ChildStack::Make(kHelperStackBytes));
    helper_stack.emplace(std::move(hs));
    helper = {helper_stack->base(), helper_stack->size()};
  }
  ChildArgs child_args{&plan, wr.get(), helper};
  long rc = CloneRun(&args, ChildEntry, &child_args);
  if (rc < 0) {
    errno = static_cast<int>(-rc);
    rc = -1;
  }
  if (rc < 0) {
    int err = errno;
    return ErrnoStatus(err, fmt::format("clone: clone3(NEWNS|NEWPID|NEWIPC|NEWUTS{}{}|PIDFD{})",
                                        plan.netns_fd < 0 ? "|NEWNET" : "",
                                        plan.new_time_ns ? "|NEWTIME" : "",
                                        plan.cgroup_v2_dir_fd >= 0
                                            ? fmt::format("|INTO_CGROUP {}", plan.cgroup_v2_path)
                                            : std::string()));
  }

  ChildProcess child(static_cast<pid_t>(rc), UniqueFd(pidfd));
  wr.Reset();
  ChildReport report;
  ssize_t n;
  do {
    n = ::read(rd.get(), &report, sizeof(report));
  } while (n < 0 && errno == EINTR);
  // CLOEXEC pipe closed by a successful execveat, and by the detaching helper's exit.
  if (n == 0) return child;
  if (n < 0) {
    int err = errno;
    return ErrnoStatus(err, "launch: read(sync pipe)");
  }
  if (n != static_cast<ssize_t>(sizeof(report))) {
    return absl::InternalError(fmt::format("launch: short report ({} bytes) from the child", n));
  }
  // `child` is killed and reaped by its destructor.
  return DescribeChildFailure(plan, report);
}

}  // namespace sbx::runtime::ns
