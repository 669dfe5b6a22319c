#include "runtime/ns/userns.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "runtime/ns/clone_vm.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/pidfd.h"

namespace sbx::runtime::ns {

namespace {

constexpr uint32_t kSlots = (kUidRangeEnd - kUidRangeFirst) / kUidRangeSize;

std::atomic<uint32_t>& Cursor() {
  // A random start: two sbxd started together do not race for the same first ranges.
  static std::atomic<uint32_t> cursor{std::random_device{}() % kSlots};
  return cursor;
}

bool ParseBase(const std::string& name, uint32_t* out) {
  if (name.empty() || name.size() > 10) return false;
  uint64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v < kUidRangeFirst || v >= kUidRangeEnd || (v - kUidRangeFirst) % kUidRangeSize != 0) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// Writes the owner line to a new (truncated) `path`, which is removed again if the write fails.
absl::Status WriteOwnerFile(const std::string& path, const std::string& owner) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("uid range: open({})", path));
  const std::string text = owner + "\n";
  ssize_t n = ::write(fd, text.data(), text.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    ::unlink(path.c_str());
    return ErrnoStatus(n < 0 ? err : EIO, fmt::format("uid range: write({})", path));
  }
  return absl::OkStatus();
}

// A claim must never be visible without its owner line: every sbxd's sweep treats an empty
// claim as stale and removes it, so a claim created with O_EXCL and written afterwards could be
// swept in between (a sbxd starting while another's pool fills did exactly that). The owner is
// therefore written to an unnamed O_TMPFILE first and linked in under the base's name; linkat
// fails with EEXIST like O_EXCL. Linking through /proc/self/fd needs no CAP_DAC_READ_SEARCH.
absl::Status CreateClaim(const std::string& dir, const std::string& path, const std::string& owner) {
  UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
  if (!fd) return ErrnoStatus(errno, fmt::format("uid range: open({}, O_TMPFILE)", dir));
  const std::string text = owner + "\n";
  const ssize_t n = ::write(fd.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus(n < 0 ? errno : EIO, fmt::format("uid range: write(claim for {})", path));
  }
  const std::string proc = fmt::format("/proc/self/fd/{}", fd.get());
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0) {
    if (errno == EEXIST) return absl::AlreadyExistsError(path);
    return ErrnoStatus(errno, fmt::format("uid range: linkat({} -> {})", proc, path));
  }
  return absl::OkStatus();
}

std::string ClaimOwner(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return "";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

UidRanges::UidRanges(std::string claim_dir) : dir_(std::move(claim_dir)) {}

std::string UidRanges::PathOf(uint32_t base) const { return fmt::format("{}/{}", dir_, base); }

absl::Status UidRanges::Init() { return Annotate(MkdirAll(dir_, 0700), "uid ranges: claim dir"); }

absl::StatusOr<uint32_t> UidRanges::Claim(const std::string& owner) {
  for (uint32_t tries = 0; tries < kSlots; ++tries) {
    const uint32_t slot = Cursor().fetch_add(1) % kSlots;
    const uint32_t base = kUidRangeFirst + slot * kUidRangeSize;
    absl::Status st = CreateClaim(dir_, PathOf(base), owner);
    if (st.ok()) return base;
    if (!absl::IsAlreadyExists(st)) return st;
  }
  return absl::ResourceExhaustedError(fmt::format(
      "uid range: all {} ranges of {} uids are claimed (see {})", kSlots, kUidRangeSize, dir_));
}

absl::Status UidRanges::Reclaim(uint32_t base, const std::string& owner) {
  uint32_t check;
  if (!ParseBase(std::to_string(base), &check)) {
    return absl::InvalidArgumentError(fmt::format("uid range: {} is not a range base", base));
  }
  absl::Status st = CreateClaim(dir_, PathOf(base), owner);
  if (st.ok() || !absl::IsAlreadyExists(st)) return st;
  std::string holder = ClaimOwner(PathOf(base));
  if (holder == owner) return absl::OkStatus();
  return absl::AlreadyExistsError(
      fmt::format("uid range {} is claimed by {}, not {}", base, holder, owner));
}

absl::Status UidRanges::Release(uint32_t base, const std::string& owner) {
  const std::string path = PathOf(base);
  std::string holder = ClaimOwner(path);
  if (holder.empty() || holder != owner) return absl::OkStatus();
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, fmt::format("uid range: unlink({})", path));
  }
  return absl::OkStatus();
}

absl::Status UidRanges::ReleaseOwner(const std::string& owner) {
  auto names = ListDir(dir_);
  if (!names.ok()) return absl::IsNotFound(names.status()) ? absl::OkStatus() : names.status();
  for (const std::string& n : *names) {
    uint32_t base;
    if (ParseBase(n, &base)) SBX_RETURN_IF_ERROR(Release(base, owner));
  }
  return absl::OkStatus();
}

absl::Status UidRanges::Transfer(uint32_t base, const std::string& from, const std::string& to) {
  const std::string path = PathOf(base);
  const std::string holder = ClaimOwner(path);
  if (holder != from) {
    return absl::FailedPreconditionError(
        fmt::format("uid range {}: claimed by \"{}\", not \"{}\"", base, holder, from));
  }
  // Not a valid base name, so sweeps skip it.
  const std::string tmp = fmt::format("{}/.{}.tmp", dir_, base);
  SBX_RETURN_IF_ERROR(WriteOwnerFile(tmp, to));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, fmt::format("uid range: rename({} -> {})", tmp, path));
  }
  return absl::OkStatus();
}

absl::Status UidRanges::Sweep(const std::string& sandboxes_dir, const std::set<std::string>& known_ids) {
  auto names = ListDir(dir_);
  if (!names.ok()) return absl::IsNotFound(names.status()) ? absl::OkStatus() : names.status();
  const std::string prefix = sandboxes_dir + "/";
  for (const std::string& n : *names) {
    uint32_t base;
    if (!ParseBase(n, &base)) continue;
    const std::string path = PathOf(base);
    const std::string owner = ClaimOwner(path);
    bool stale = false;
    if (owner.compare(0, prefix.size(), prefix) == 0) {
      stale = known_ids.count(owner.substr(prefix.size())) == 0;
    } else {
      struct stat st;
      stale = owner.empty() || (::stat(owner.c_str(), &st) != 0 && errno == ENOENT);
    }
    if (stale) {
      spdlog::info("ns: releasing stale uid range {} (owner {})", base, owner.empty() ? "?" : owner);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        return ErrnoStatus(errno, fmt::format("uid range sweep: unlink({})", path));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The holder only keeps its new user namespace alive until the parent has written the maps
// and opened the namespace; then the parent SIGKILLs it. It must not wait for a pipe's EOF:
// children cloned concurrently by other sbxd threads get copies of that pipe's write end (they
// share no fd table but copy it), and two holders could then wait on each other forever.
// Syscalls only (it may share our memory); it runs with the creating thread's signal mask,
// which in sbxd blocks everything but SIGKILL.
// A holder also dies with sbxd: one left by an sbxd killed between the clone and its own kill
// would pin a user namespace, and the uid range it maps, for good. The ppid check closes the
// window before the prctl. Set after any change of credentials, which clears it.
void DieWithParent(pid_t parent) {
  ::syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (::syscall(SYS_getppid) != parent) ::syscall(SYS_exit_group, 0);
}

int HoldUserns(void* raw) {
  DieWithParent(*static_cast<const pid_t*>(raw));
  for (;;) ::pause();
}

// A holder whose namespace is owned by an unprivileged host uid (the sandbox's agent): the
// owner of a user namespace is the euid of the process that makes it, so this one becomes
// `owner` first (raw syscalls: glibc's wrappers would signal every thread of the memory it
// shares), then unshares, then reports 0 or an errno on the pipe and waits to be killed.
struct OwnedHolderArgs {
  uid_t owner;
  int report_fd;
  pid_t parent;
};

int HoldOwnedUserns(void* raw) {
  const auto* a = static_cast<const OwnedHolderArgs*>(raw);
  int err = 0;
  if (::syscall(SYS_setgroups, 0, nullptr) != 0 ||
      ::syscall(SYS_setresgid, a->owner, a->owner, a->owner) != 0 ||
      ::syscall(SYS_setresuid, a->owner, a->owner, a->owner) != 0 ||
      ::unshare(CLONE_NEWUSER) != 0) {
    err = errno == 0 ? EIO : errno;
  }
  DieWithParent(a->parent);
  ssize_t n;
  do {
    n = ::write(a->report_fd, &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  for (;;) ::pause();
}

// Waits for the owned holder's report: a read of exactly one int, never an EOF (see above),
// and the holder's pidfd in case it died before writing.
absl::Status WaitHolderReport(int report_fd, int pidfd) {
  struct pollfd pfds[2] = {{report_fd, POLLIN, 0}, {pidfd, POLLIN, 0}};
  for (;;) {
    int rc = ::poll(pfds, 2, 5000);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoStatus(errno, "user namespace: poll(holder report)");
    if (rc == 0) return absl::DeadlineExceededError("user namespace: the holder did not report within 5 s");
    break;
  }
  if (!(pfds[0].revents & POLLIN)) {
    return absl::InternalError("user namespace: the holder exited before it reported");
  }
  int err = 0;
  ssize_t n;
  do {
    n = ::read(report_fd, &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(err))) {
    return ErrnoStatus(n < 0 ? errno : EIO, "user namespace: read(holder report)");
  }
  if (err != 0) {
    return ErrnoStatus(err, "user namespace: as the owner uid: setresuid + unshare(CLONE_NEWUSER)");
  }
  return absl::OkStatus();
}

absl::Status WriteMap(pid_t pid, const char* file, uint32_t base, uint32_t count) {
  const std::string path = fmt::format("/proc/{}/{}", pid, file);
  return Annotate(WriteStringToFile(path, fmt::format("0 {} {}\n", base, count)), "user namespace");
}

}  // namespace

absl::StatusOr<UniqueFd> MakeUserNamespace(uint32_t base, uint32_t count, std::optional<uid_t> owner) {
  int pidfd = -1;
  struct clone_args args;
  std::memset(&args, 0, sizeof(args));
  // CLONE_FILES: the holder shares sbxd's descriptor table instead of copying it. sbxd holds
  // about one descriptor per running sandbox, and a copy costs the clone a reference each
  // (0.8 ms per namespace at 5,000 against 0.24 ms shared: bench/micro/userns_cost.cc); a
  // copy would also keep every socket and file of sbxd open while the holder lives. The
  // holder opens and closes nothing (the owned kind writes its report to a pipe sbxd keeps
  // open until the holder is reaped).
  args.flags = CLONE_PIDFD | CLONE_FILES | (owner ? 0 : CLONE_NEWUSER);
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  std::optional<ChildStack> stack;
  if constexpr (kCloneSharesVm) {
    SBX_ASSIGN_OR_RETURN(ChildStack s, ChildStack::Make(64 << 10));
    stack.emplace(std::move(s));
    args.flags |= CLONE_VM;
    args.stack = reinterpret_cast<uint64_t>(stack->base());
    args.stack_size = stack->size();
  }
  UniqueFd report_r, report_w;
  OwnedHolderArgs holder_args{};
  if (owner) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, "user namespace: pipe2(holder report)");
    report_r.Reset(p[0]);
    report_w.Reset(p[1]);
    holder_args = OwnedHolderArgs{*owner, report_w.get(), ::getpid()};
  }
  pid_t parent = ::getpid();
  long rc = owner ? CloneRun(&args, HoldOwnedUserns, &holder_args) : CloneRun(&args, HoldUserns, &parent);
  if (rc < 0) {
    return ErrnoStatus(static_cast<int>(-rc),
                       owner ? "user namespace: clone3(holder)" : "user namespace: clone3(CLONE_NEWUSER)");
  }
  const pid_t pid = static_cast<pid_t>(rc);
  UniqueFd pfd(pidfd);

  absl::StatusOr<UniqueFd> result = [&]() -> absl::StatusOr<UniqueFd> {
    if (owner) SBX_RETURN_IF_ERROR(WaitHolderReport(report_r.get(), pfd.get()));
    SBX_RETURN_IF_ERROR(WriteMap(pid, "uid_map", base, count));
    SBX_RETURN_IF_ERROR(WriteMap(pid, "gid_map", base, count));
    const std::string ns_path = fmt::format("/proc/{}/ns/user", pid);
    UniqueFd ns(::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns) return ErrnoStatus(errno, fmt::format("user namespace: open({})", ns_path));
    return ns;
  }();

  // End the holder and reap it before its stack goes away.
  PidfdSendSignal(pfd.get(), SIGKILL);
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pfd.get()), &info, WEXITED) != 0 &&
         errno == EINTR) {
  }
  return result;
}

UsernsPool::UsernsPool(UidRanges* ranges, std::string pool_owner, int size)
    : ranges_(ranges),
      pool_owner_(std::move(pool_owner)),
      pool_(size, [this] { return Make(pool_owner_); }, [](const absl::Status& st) {
        spdlog::warn("userns pool: {} (launches make their own meanwhile)", std::string(st.message()));
        return true;
      }) {}

UsernsPool::~UsernsPool() {
  pool_.Stop();
  for (const PreparedUserns& u : pool_.Drain()) {
    if (absl::Status st = ranges_->Release(u.base, pool_owner_); !st.ok()) {
      spdlog::warn("userns pool: {}", std::string(st.message()));
    }
  }
}

void UsernsPool::Start() { pool_.Start(); }

int UsernsPool::ready() const { return pool_.ready(); }

absl::StatusOr<PreparedUserns> UsernsPool::Make(const std::string& owner) {
  SBX_ASSIGN_OR_RETURN(uint32_t base, ranges_->Claim(owner));
  auto fd = MakeUserNamespace(base, kGuestUidCount, AgentUidOf(base));
  if (!fd.ok()) {
    (void)ranges_->Release(base, owner);
    return fd.status();
  }
  return PreparedUserns{base, std::move(*fd)};
}

absl::StatusOr<PreparedUserns> UsernsPool::Take(const std::string& owner) {
  std::optional<PreparedUserns> pooled = pool_.Take();
  if (!pooled) return Make(owner);
  if (absl::Status st = ranges_->Transfer(pooled->base, pool_owner_, owner); !st.ok()) {
    // The pooled claim is no longer ours (removed by hand, or by a sweep of an older sbxd):
    // that range may be someone else's now, so its namespace is dropped and the launch gets a
    // fresh claim instead of failing.
    spdlog::warn("userns pool: dropping pooled range: {}", std::string(st.message()));
    (void)ranges_->Release(pooled->base, pool_owner_);
    return Make(owner);
  }
  return std::move(*pooled);
}

absl::Status ProbeIdmap(const std::string& dir) {
  SBX_ASSIGN_OR_RETURN(UniqueFd userns, MakeUserNamespace(kUidRangeFirst));
  UniqueFd tree(static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
  if (!tree) return ErrnoStatus(errno, fmt::format("idmap probe: open_tree({}, OPEN_TREE_CLONE)", dir));
  struct mount_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.attr_set = MOUNT_ATTR_IDMAP;
  attr.userns_fd = static_cast<uint64_t>(userns.get());
  if (::syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH, &attr, sizeof(attr)) != 0) {
    return ErrnoStatus(errno, fmt::format(
        "idmap probe: mount_setattr(MOUNT_ATTR_IDMAP) on {}: this file system cannot be idmapped "
        "(needs Linux 5.12+ and ext4, xfs, btrfs, or tmpfs on 6.3+); put the state dir on one, "
        "or run with --userns=false (weaker: sandbox root is then host root)", dir));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ReadUidBase(pid_t pid) {
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFileToString(fmt::format("/proc/{}/uid_map", pid)));
  unsigned long inside = 0, outside = 0, count = 0;
  if (std::sscanf(text.c_str(), "%lu %lu %lu", &inside, &outside, &count) != 3 || inside != 0) {
    return absl::InvalidArgumentError(fmt::format("uid_map of pid {}: unexpected \"{}\"", pid, text));
  }
  return static_cast<uint32_t>(outside);
}

}  // namespace sbx::runtime::ns
