#include "agent/spawn.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::agent {
namespace {

// A fixed-size message builder for the child: no allocation, only write(2).
class ChildMessage {
 public:
  ChildMessage& Add(const char* s) {
    while (*s && len_ < sizeof(buf_)) buf_[len_++] = *s++;
    return *this;
  }
  void WriteTo(int fd) {
    size_t off = 0;
    while (off < len_) {
      ssize_t n = ::write(fd, buf_ + off, len_ - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

 private:
  char buf_[1024];
  size_t len_ = 0;
};

// strerrordesc_np returns a static, locale-independent string: safe between fork and exec,
// unlike strerror.
const char* ErrText(int err) {
  const char* s = ::strerrordesc_np(err);
  return s ? s : "Unknown error";
}

[[noreturn]] void ChildFail(const char* step, const char* what, int err, int code) {
  ChildMessage().Add("sbx-agent: ").Add(step).Add(" ").Add(what).Add(": ").Add(ErrText(err))
      .Add("\n").WriteTo(STDERR_FILENO);
  ::_exit(code);
}

void CloseFrom(int lowfd) {
  if (::syscall(SYS_close_range, lowfd, ~0U, 0) == 0) return;
  // Kernels before 5.9: close a bounded range one by one.
  long max = ::sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
  for (int fd = lowfd; fd < max; ++fd) ::close(fd);
}

// The signals to reset in the child (RecordSignalDispositions): a fixed array, which the child
// reads on the agent's memory without allocating.
struct SignalResets {
  int sigs[NSIG] = {};
  int count = 0;
};
SignalResets g_signal_resets;
std::atomic<bool> g_signals_recorded{false};

}  // namespace

void RecordSignalDispositions() {
  SignalResets r;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction old {};
    // A signal the query refuses (none on Linux) is reset as before, to be safe.
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) r.sigs[r.count++] = sig;
  }
  g_signal_resets = r;
  g_signals_recorded.store(true, std::memory_order_release);
}

std::vector<std::string> BuildEnv(char** base, const std::map<std::string, std::string>& overlay) {
  std::map<std::string, std::string> merged;
  for (char** e = base; e && *e; ++e) {
    std::string_view entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    std::string key(entry.substr(0, eq));
    if (key.rfind("SBX_AGENT_", 0) == 0) continue;
    merged.emplace(std::move(key), std::string(entry.substr(eq + 1)));
  }
  for (const auto& [k, v] : overlay) merged[k] = v;
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [k, v] : merged) out.push_back(k + "=" + v);
  return out;
}

std::vector<std::string> ExecCandidates(const std::string& argv0, const std::string& path) {
  if (argv0.find('/') != std::string::npos) return {argv0};
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos
                                                                    : colon - start);
    out.push_back(dir.empty() ? argv0 : (dir.back() == '/' ? dir + argv0 : dir + "/" + argv0));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

absl::StatusOr<std::pair<UniqueFd, UniqueFd>> OpenPty(unsigned short rows, unsigned short cols) {
  UniqueFd master(::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!master) return ErrnoStatus(errno, "pty: open(/dev/ptmx)");
  int unlock = 0;
  if (::ioctl(master.get(), TIOCSPTLCK, &unlock) != 0) {
    return ErrnoStatus(errno, "pty: ioctl(TIOCSPTLCK)");
  }
  // TIOCGPTPEER opens the slave through the master, so it works whatever devpts instance
  // /dev/pts shows (Linux 4.13); older kernels get the path from TIOCGPTN.
  UniqueFd slave(::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!slave) {
    unsigned int n = 0;
    if (::ioctl(master.get(), TIOCGPTN, &n) != 0) {
      return ErrnoStatus(errno, "pty: ioctl(TIOCGPTN)");
    }
    const std::string path = fmt::format("/dev/pts/{}", n);
    slave.Reset(::open(path.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!slave) return ErrnoStatus(errno, fmt::format("pty: open({})", path));
  }
  winsize ws{};
  ws.ws_row = rows;
  ws.ws_col = cols;
  if (::ioctl(master.get(), TIOCSWINSZ, &ws) != 0) {
    return ErrnoStatus(errno, "pty: ioctl(TIOCSWINSZ)");
  }
  return std::make_pair(std::move(master), std::move(slave));
}

namespace {

// Everything the child reads between fork and exec, built before the fork: the child's steps
// below only use it (no allocation, no logging). Holds pointers into itself: built in place.
struct ChildPlan {
  ChildPlan() = default;
  ChildPlan(const ChildPlan&) = delete;
  ChildPlan& operator=(const ChildPlan&) = delete;

  std::vector<std::string> candidates;
  std::vector<const char*> cand_ptrs;
  std::vector<char*> argv;
  std::vector<char*> envp;
  const char* cwd = "/";
  const char* argv0 = nullptr;
  bool tty = false;
  bool switch_user = false;
  const SandboxIdentity* identity = nullptr;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  char uid_text[32] = {};  // "uid:gid", for the child's error messages
  struct sigaction dfl {};
  sigset_t empty_mask;
};

// The child's stdio and the parent's ends of it.
struct ChildFds {
  UniqueFd out_r, out_w, err_r, err_w, in_fd, in_w, pty_master;
  int shared_in = -1;  // the child's stdin when in_fd is empty: SharedDevNull(), not owned
  int stdin_fd() const { return in_fd ? in_fd.get() : shared_in; }
};

// One /dev/null for every child's stdin, opened once per agent: an open and a close less per
// exec. Sharing the open file description is harmless: /dev/null reads EOF whatever its flags
// or offset, and this one is read-only. -1 (each spawn tries again) while it cannot be opened.
int SharedDevNull() {
  static std::atomic<int> fd{-1};
  int have = fd.load(std::memory_order_acquire);
  if (have >= 0) return have;
  const int opened = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (opened < 0) return -1;
  if (fd.compare_exchange_strong(have, opened, std::memory_order_acq_rel)) return opened;
  ::close(opened);  // another thread's won
  return have;
}

void PreparePlan(const SpawnSpec& spec, ChildPlan& plan) {
  std::string path = kDefaultPath;
  for (const auto& e : spec.env) {
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  plan.candidates = ExecCandidates(spec.argv[0], path);
  for (const auto& c : plan.candidates) plan.cand_ptrs.push_back(c.c_str());
  for (const auto& a : spec.argv) plan.argv.push_back(const_cast<char*>(a.c_str()));
  plan.argv.push_back(nullptr);
  for (const auto& e : spec.env) plan.envp.push_back(const_cast<char*>(e.c_str()));
  plan.envp.push_back(nullptr);
  plan.cwd = spec.cwd.empty() ? "/" : spec.cwd.c_str();
  plan.argv0 = spec.argv[0].c_str();
  plan.tty = spec.tty;
  plan.switch_user = spec.user.has_value();
  plan.identity = spec.identity;
  if (plan.switch_user) {
    plan.uid = spec.user->uid;
    plan.gid = spec.user->gid;
    plan.groups = spec.user->groups;
  }
  fmt::format_to_n(plan.uid_text, sizeof(plan.uid_text) - 1, "{}:{}", plan.uid, plan.gid)
      .out[0] = '\0';
  plan.dfl.sa_handler = SIG_DFL;
  sigemptyset(&plan.dfl.sa_mask);
  sigemptyset(&plan.empty_mask);
}

absl::Status OpenStdio(const SpawnSpec& spec, ChildFds& fds) {
  if (spec.tty) {
    SBX_ASSIGN_OR_RETURN(auto pty, OpenPty(spec.rows, spec.cols));
    fds.pty_master = std::move(pty.first);
    fds.in_fd = std::move(pty.second);  // the slave: 0, 1 and 2 of the child
    return absl::OkStatus();
  }
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoStatus(errno, "spawn: pipe2(stdout)");
  fds.out_r.Reset(out_pipe[0]);
  fds.out_w.Reset(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoStatus(errno, "spawn: pipe2(stderr)");
  fds.err_r.Reset(err_pipe[0]);
  fds.err_w.Reset(err_pipe[1]);
  if (spec.stdin_pipe) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, "spawn: pipe2(stdin)");
    fds.in_fd.Reset(p[0]);
    fds.in_w.Reset(p[1]);
    return absl::OkStatus();
  }
  // stdin: /dev/null, or the read end of an already closed pipe if the rootfs lacks it.
  fds.shared_in = SharedDevNull();
  if (fds.shared_in < 0) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, "spawn: pipe2(stdin)");
    fds.in_fd.Reset(p[0]);
    ::close(p[1]);
  }
  return absl::OkStatus();
}

// ---- the child's steps: async-signal-safe calls only, on what the plan holds ----------------

void ChildSessionAndSignals(const ChildPlan& plan, const ChildFds& fds) {
  if (plan.tty) {
    // A new session (whose id is also the process group, so group signals work alike)
    // with the pty as its controlling terminal: job control and ^C reach the foreground job.
    if (::setsid() < 0 || ::ioctl(fds.in_fd.get(), TIOCSCTTY, 0) != 0) ::_exit(126);
  } else {
    ::setpgid(0, 0);
  }
  // Only what is not SIG_DFL already (a query per signal in the parent would cost the same):
  // exec resets handlers by itself, SIG_IGN it keeps, and the agent ignores SIGPIPE.
  for (int i = 0; i < g_signal_resets.count; ++i) {
    ::sigaction(g_signal_resets.sigs[i], &plan.dfl, nullptr);
  }
  ::sigprocmask(SIG_SETMASK, &plan.empty_mask, nullptr);
}

void ChildStdio(const ChildPlan& plan, const ChildFds& fds) {
  // The agent keeps fds 0-2 open, so the pipe ends are >= 3 and dup2 clears CLOEXEC.
  const int out_fd = plan.tty ? fds.in_fd.get() : fds.out_w.get();
  const int err_fd = plan.tty ? fds.in_fd.get() : fds.err_w.get();
  if (::dup2(fds.stdin_fd(), STDIN_FILENO) < 0 || ::dup2(out_fd, STDOUT_FILENO) < 0 ||
      ::dup2(err_fd, STDERR_FILENO) < 0) {
    ::_exit(126);
  }
}

// Make workload processes the OOM killer's first choice over the agent (PID 1, holding
// every session's output), so that an OOM kill takes the workload and the agent lives to
// report it. Lowering the agent's own score instead would need CAP_SYS_RESOURCE, which
// root lacks on the project's hosts; raising one's own needs no privilege. Before the user
// switch: a non-root process may lose write access to its /proc/self files. A child of a
// non-dumpable agent has /proc/self files of host root (identity.h): dumpable for this
// write only, as the agent's uid (nothing in the sandbox shares it). The flag belongs to the
// memory, which the child shares with the agent (kSpawnSharesVm): it is cleared again right
// after the write, and the parent clears it once more after the credential change below,
// which sets it to fs.suid_dumpable. Best effort (a rootfs without /proc): the only cost is a
// worse victim choice.
void ChildRaiseOomScore(const ChildPlan& plan) {
  const bool dumpable = plan.identity != nullptr && plan.identity->userns_fd >= 0;
  if (dumpable) ::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!::write(fd, "500", 3);
    ::close(fd);
  }
  if (dumpable) ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

void ChildIdentity(const ChildPlan& plan) {
  if (plan.identity != nullptr) {
    const char* step = "enter the sandbox";
    if (int err = EnterSandbox(*plan.identity, plan.switch_user, plan.uid, plan.gid,
                               plan.groups.data(), plan.groups.size(), &step);
        err != 0) {
      ChildFail(step, plan.uid_text, err, 126);
    }
  } else if (plan.switch_user) {
    // Raw syscalls, same semantics as the libc calls: the child shares the agent's memory
    // (kSpawnSharesVm), and libc's set*id wrappers may consult its thread list.
    if (::syscall(SYS_setgroups, plan.groups.size(), plan.groups.data()) != 0) {
      ChildFail("setgroups for", plan.uid_text, errno, 126);
    }
    if (::syscall(SYS_setgid, plan.gid) != 0) ChildFail("setgid for", plan.uid_text, errno, 126);
    if (::syscall(SYS_setuid, plan.uid) != 0) ChildFail("setuid for", plan.uid_text, errno, 126);
  }
}

[[noreturn]] void ChildExec(const ChildPlan& plan) {
  // After the identity: it needs the user namespace and cgroup fds.
  CloseFrom(3);
  if (::chdir(plan.cwd) != 0) ChildFail("chdir", plan.cwd, errno, 126);
  int err = ENOENT;
  bool saw_eacces = false;
  for (const char* c : plan.cand_ptrs) {
    ::execve(c, plan.argv.data(), plan.envp.data());
    err = errno;
    if (err == EACCES) {
      saw_eacces = true;
      continue;
    }
    // Like execvp: keep searching past entries that do not hold the file.
    if (err == ENOENT || err == ENOTDIR || err == ESTALE || err == ENODEV ||
        err == ETIMEDOUT || err == ELOOP || err == ENAMETOOLONG) {
      continue;
    }
    break;
  }
  if (saw_eacces && (err == ENOENT || err == ENOTDIR)) err = EACCES;
  ChildFail("exec", plan.argv0, err, 127);
}

[[noreturn]] void RunChild(const ChildPlan& plan, const ChildFds& fds) {
  ChildSessionAndSignals(plan, fds);
  ChildStdio(plan, fds);
  ChildRaiseOomScore(plan);
  ChildIdentity(plan);
  ChildExec(plan);
}

// posix_spawn's model: the child shares the agent's memory (CLONE_VM) on a stack of its own,
// and the agent waits (CLONE_VFORK) until it has exec'd or exited. A copying fork duplicated
// the agent's page tables, then took a copy-on-write fault for every page either side wrote
// and tore the copy down at exec: most of the agent's CPU time per exec (perf, issue 15).
// The child's steps above write only their own stack, the kernel's per-task state (its fd
// table, credentials, signal dispositions: none of CLONE_FILES, CLONE_FS, CLONE_SIGHAND) and
// errno, which the waiting parent does not read. The agent installs no signal handlers (only
// SIG_IGN and signalfd), so no handler can run on the shared memory before exec. Sanitizer
// runtimes do not expect a second task on their memory: those builds keep fork.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
constexpr bool kSpawnSharesVm = true;
#else
constexpr bool kSpawnSharesVm = false;
#endif

// The child's own stack, made once per spawning thread (CLONE_VFORK holds that thread until
// the child is done with it) and kept: its lowest page is a guard, so an overflow faults.
constexpr size_t kChildStackBytes = 128 << 10;

absl::StatusOr<char*> ChildStackTop() {
  thread_local char* top = nullptr;
  if (top != nullptr) return top;
  void* p = ::mmap(nullptr, kChildStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "spawn: mmap(child stack)");
  if (::mprotect(p, 4096, PROT_NONE) != 0) {
    const int err = errno;
    ::munmap(p, kChildStackBytes);
    return ErrnoStatus(err, "spawn: mprotect(child stack guard)");
  }
  top = static_cast<char*>(p) + kChildStackBytes;
  return top;
}

struct ChildArgs {
  const ChildPlan* plan;
  const ChildFds* fds;
};

int ChildEntry(void* arg) {
  const auto* a = static_cast<const ChildArgs*>(arg);
  RunChild(*a->plan, *a->fds);
}

// Starts the child; returns its pid, or -1 with errno set.
pid_t StartChild(const ChildPlan& plan, const ChildFds& fds, char* stack_top) {
  if constexpr (!kSpawnSharesVm) {
    const pid_t pid = ::fork();
    if (pid == 0) RunChild(plan, fds);
    return pid;
  }
  ChildArgs args{&plan, &fds};
  // Plain clone, not clone3: the sandbox's seccomp policy answers clone3 with ENOSYS so that
  // clone's flags can be checked, and these carry no namespace flag.
  return ::clone(ChildEntry, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
}

// The parent's ends, non-blocking.
absl::StatusOr<SpawnedProcess> ParentEnds(pid_t pid, ChildFds& fds, bool tty) {
  SpawnedProcess p;
  p.pid = pid;
  if (tty) {
    ::fcntl(fds.pty_master.get(), F_SETFL, O_NONBLOCK);
    // A second descriptor for the writes: epoll watches each fd once, and input and output
    // are paused and resumed independently.
    p.stdin_fd.Reset(::fcntl(fds.pty_master.get(), F_DUPFD_CLOEXEC, 3));
    if (!p.stdin_fd) {
      const int err = errno;
      ::kill(pid, SIGKILL);
      return ErrnoStatus(err, "spawn: fcntl(F_DUPFD_CLOEXEC) of the pty master");
    }
    p.stdout_fd = std::move(fds.pty_master);
    return p;
  }
  ::fcntl(fds.out_r.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(fds.err_r.get(), F_SETFL, O_NONBLOCK);
  p.stdout_fd = std::move(fds.out_r);
  p.stderr_fd = std::move(fds.err_r);
  if (fds.in_w) {
    ::fcntl(fds.in_w.get(), F_SETFL, O_NONBLOCK);
    p.stdin_fd = std::move(fds.in_w);
  }
  return p;
}

}  // namespace

absl::StatusOr<SpawnedProcess> Spawn(const SpawnSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return absl::InvalidArgumentError("spawn: argv is empty");
  }
  if (!g_signals_recorded.load(std::memory_order_acquire)) RecordSignalDispositions();
  // Everything the child touches is built here, before fork.
  ChildPlan plan;
  PreparePlan(spec, plan);
  ChildFds fds;
  SBX_RETURN_IF_ERROR(OpenStdio(spec, fds));
  char* stack_top = nullptr;
  if constexpr (kSpawnSharesVm) {
    SBX_ASSIGN_OR_RETURN(stack_top, ChildStackTop());
  }

  const pid_t pid = StartChild(plan, fds, stack_top);
  if (pid < 0) return ErrnoStatus(errno, kSpawnSharesVm ? "spawn: clone(CLONE_VM|CLONE_VFORK)" : "spawn: fork");
  if constexpr (kSpawnSharesVm) {
    // The child made the shared memory dumpable for its oom_score_adj write, and its credential
    // change set it to fs.suid_dumpable (or it failed before): the agent is non-dumpable again
    // before anything else runs in it (identity.h).
    if (plan.identity != nullptr && plan.identity->userns_fd >= 0) {
      ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
  } else if (!spec.tty) {
    // Parent of a copying fork: also set the group here so that a signal sent right after fork
    // finds it (a tty child makes its own session, which fails setpgid here harmlessly). With
    // CLONE_VFORK the child has already set it, and exec'd or exited, by the time we run.
    ::setpgid(pid, pid);
  }
  return ParentEnds(pid, fds, spec.tty);
}

}  // namespace sbx::agent
