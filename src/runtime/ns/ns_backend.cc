#include "runtime/ns/ns_backend.h"

#include <fcntl.h>
#include <signal.h>
#include "runtime/ns/pidfd.h"
#include <poll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstring>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"
#include "runtime/ns/agent_image.h"
#include "runtime/ns/caps.h"
#include "runtime/ns/cgroup.h"
#include "runtime/ns/cgroup_favor.h"
#include "runtime/ns/cgroup_pool.h"
#include "runtime/ns/net_counters.h"
#include "runtime/ns/netns_pool.h"
#include "runtime/ns/ns_network.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/launcher.h"
#include "runtime/ns/mounts.h"
#include "runtime/ns/ns_instance.h"
#include "runtime/ns/ns_shared.h"
#include "runtime/ns/disk_image.h"
#include "runtime/ns/landlock.h"
#include "runtime/ns/seccomp.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::ns {

namespace {

constexpr char kLogName[] = "agent.log";
constexpr int kListenBacklog = 128;

// The last bytes of agent.log, to explain an agent that died during start-up.
std::string LogTail(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok() || text->empty()) return "";
  constexpr size_t kTail = 1024;
  std::string t = text->size() > kTail ? text->substr(text->size() - kTail) : *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

bool ValidHostname(const std::string& h) {
  if (h.empty() || h.size() > 64) return false;
  for (char c : h) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_')) return false;
  }
  return true;
}

absl::StatusOr<CgroupLimits> ResolveLimits(const Resources& r) {
  if (r.vcpu < 0 || r.memory_mib < 0 || r.pids < 0) {
    return absl::InvalidArgumentError(fmt::format(
        "resources: negative value (vcpu {}, memory_mib {}, pids {})", r.vcpu, r.memory_mib, r.pids));
  }
  // A field left 0 gets the built-in default (resources.h).
  const Resources built_in;
  CgroupLimits l;
  l.memory_bytes = (r.memory_mib == 0 ? built_in.memory_mib : r.memory_mib) << 20;
  l.pids = r.pids == 0 ? built_in.pids : r.pids;
  l.cpu_period_us = kCpuPeriodUs;
  l.cpu_quota_us = (r.vcpu == 0 ? built_in.vcpu : r.vcpu) * kCpuPeriodUs;
  return l;
}

// The sandbox's state directory: removed (with whatever overlayfs left in it) on destruction
// unless Release()d.
class SandboxDirOwner {
 public:
  explicit SandboxDirOwner(std::string path) : path_(std::move(path)) {}
  ~SandboxDirOwner() {
    if (!armed_) return;
    if (absl::Status s = RemoveTree(path_); !s.ok()) {
      spdlog::error("ns: cleanup of {} failed: {}", path_, std::string(s.message()));
    }
  }
  SandboxDirOwner(const SandboxDirOwner&) = delete;
  SandboxDirOwner& operator=(const SandboxDirOwner&) = delete;
  absl::Status Make() {
    if (::mkdir(path_.c_str(), 0700) != 0) {
      int err = errno;
      armed_ = false;  // never remove what we did not create
      if (err == EEXIST) {
        return absl::AlreadyExistsError(fmt::format(
            "sandbox dir: {} already exists (a leftover? Sweep removes it)", path_));
      }
      return ErrnoStatus(err, fmt::format("sandbox dir: mkdir({})", path_));
    }
    // The one mount point: the disk (upper, work and the idmapped lower's directory), then the
    // overlay, stack on it (BuildMountPlan).
    const std::string p = fmt::format("{}/rootfs", path_);
    if (::mkdir(p.c_str(), 0755) != 0) return ErrnoStatus(errno, fmt::format("sandbox dir: mkdir({})", p));
    return absl::OkStatus();
  }
  void Release() { armed_ = false; }

 private:
  std::string path_;
  bool armed_ = true;
};

// The sandbox's host uid range: released on destruction unless Release()d.
class UidClaim {
 public:
  UidClaim(UidRanges* ranges, uint32_t base, std::string owner)
      : ranges_(ranges), base_(base), owner_(std::move(owner)) {}
  ~UidClaim() {
    if (ranges_ == nullptr) return;
    if (absl::Status s = ranges_->Release(base_, owner_); !s.ok()) {
      spdlog::error("ns: {}", std::string(s.message()));
    }
  }
  UidClaim(const UidClaim&) = delete;
  UidClaim& operator=(const UidClaim&) = delete;
  uint32_t base() const { return base_; }
  void Release() { ranges_ = nullptr; }

 private:
  UidRanges* ranges_;
  uint32_t base_;
  std::string owner_;
};

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(fmt::format(
        "agent socket: path {} is longer than {} bytes; use a shorter state_dir", path,
        sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "agent socket: socket(AF_UNIX, SOCK_STREAM)");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, fmt::format("agent socket: bind({})", path));
  }
  // The sandbox dir is 0700 already; 0600 keeps the socket private even if that changes.
  if (::chmod(path.c_str(), 0600) != 0) return ErrnoStatus(errno, fmt::format("agent socket: chmod({})", path));
  if (::listen(fd.get(), kListenBacklog) != 0) {
    return ErrnoStatus(errno, fmt::format("agent socket: listen({})", path));
  }
  return fd;
}

// Create's clock and trace, kept out of the steps' way: After() stamps the end of a step that
// succeeded, and LogCreated() reports the spans between stamps. With debug logging on, the
// child also stamps its own milestones into a page shared with it (LaunchPlan::trace); without
// it nothing here makes a syscall.
class CreateTrace {
 public:
  enum Stamp { kStart, kMkdir, kDisk, kUsernsTaken, kUserns, kPlanned, kCgroups, kPrepared, kExec, kReady, kStamps };

  CreateTrace() { at_[kStart] = Clock::now(); }
  ~CreateTrace() {
    if (page_ != MAP_FAILED) ::munmap(page_, kPageBytes);
  }
  CreateTrace(const CreateTrace&) = delete;
  CreateTrace& operator=(const CreateTrace&) = delete;

  absl::Status After(Stamp stamp, absl::Status step) {
    if (step.ok()) at_[stamp] = Clock::now();
    return step;
  }
  void After(Stamp stamp) { at_[stamp] = Clock::now(); }

  void ShareWithChild(LaunchPlan& plan) {
    if (!spdlog::should_log(spdlog::level::debug)) return;
    page_ = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page_ == MAP_FAILED) return;
    plan.trace = static_cast<uint64_t*>(page_);
    plan.mounts.trace = plan.trace;
  }

  // The child's stamps (CLOCK_MONOTONIC, as steady_clock), relative to the clone.
  void LogChildMilestones(const std::string& id, const LaunchPlan& plan) const {
    if (plan.trace == nullptr) return;
    const uint64_t base = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(at_[kPrepared].time_since_epoch()).count());
    std::string steps;
    static constexpr const char* kNames[] = {"start", "signals", "joined", "cgroupns", "mounts",
                                             "pivot", "uts+lo", "stdio", "caps", "seccomp", "exec"};
    for (int i = 0; i < kTraceSlots; ++i) {
      if (plan.trace[i] == 0) continue;
      steps += fmt::format(" {} +{:.2f}", kNames[i], (static_cast<double>(plan.trace[i]) - static_cast<double>(base)) / 1e6);
    }
    static constexpr const char* kMountNames[] = {"disk", "lower", "overlay", "binds", "proc", "dev", "masks", "tmp"};
    steps += " | mounts:";
    for (int i = 0; i < kMtSlots; ++i) {
      const uint64_t t = plan.trace[kMountTraceFirst + i];
      if (t != 0) steps += fmt::format(" {} +{:.2f}", kMountNames[i], (static_cast<double>(t) - static_cast<double>(base)) / 1e6);
    }
    spdlog::debug("ns: {} child milestones (ms after clone):{}", id, steps);
  }

  void LogCreated(const std::string& id, pid_t pid) const {
    spdlog::debug(
        "ns: created {} (pid {}) in {:.2f} ms: dir {:.2f} (mkdir {:.2f}, disk {:.2f}, userns {:.2f}, chown {:.2f}), "
        "cgroups {:.2f}, prepare {:.2f}, clone..exec {:.2f}, agent ready {:.2f}",
        id, pid, MsSince(at_[kStart]), Ms(kStart, kPlanned), Ms(kStart, kMkdir), Ms(kMkdir, kDisk),
        Ms(kDisk, kUsernsTaken), Ms(kUsernsTaken, kUserns), Ms(kPlanned, kCgroups),
        Ms(kCgroups, kPrepared), Ms(kPrepared, kExec), Ms(kExec, kReady));
  }

 private:
  static constexpr size_t kPageBytes = 4096;
  double Ms(Stamp from, Stamp to) const {
    return std::chrono::duration<double, std::milli>(at_[to] - at_[from]).count();
  }
  std::array<Clock::time_point, kStamps> at_{};
  void* page_ = MAP_FAILED;
};

// One Create in progress (docs/isolation.md §2.2): the plan the child will read, and the owner
// of every kernel object built so far. The owners are members in creation order, so when a
// step fails they unwind in reverse; Record() hands what must outlive Create to the instance.
class Creation {
 public:
  Creation(const NsBackend::Shared& s, const SandboxSpec& spec)
      : s_(s),
        spec_(spec),
        dir_(s.DirOf(spec.id)),
        socket_path_(fmt::format("{}/{}", dir_, kSocketName)),
        log_path_(fmt::format("{}/{}", dir_, kLogName)) {}

  LaunchPlan& plan() { return plan_; }
  pid_t pid() const { return pid_; }

  // 1. The id names every object below, so a hostile one could reach a path. The template,
  //    binds and environment are checked where they are used (steps 3 and 7).
  absl::Status Validate() {
    if (!IsValidId(spec_.id, kIdPrefix)) {
      return absl::InvalidArgumentError(fmt::format("create: invalid sandbox id \"{}\"", spec_.id));
    }
    if (spec_.network_ready && !spec_.egress.is_null()) {
      return absl::InvalidArgumentError(fmt::format(
          "create {}: a network-ready sandbox gets its egress at AttachEgress, not at create",
          spec_.id));
    }
    hostname_ = spec_.hostname.empty() ? spec_.id.substr(0, 12) : spec_.hostname;
    if (!ValidHostname(hostname_)) {
      return absl::InvalidArgumentError(fmt::format("create: invalid hostname \"{}\"", hostname_));
    }
    return absl::OkStatus();
  }

  // 2. A 0 field takes its default; a limit the cgroup driver cannot enforce fails the create.
  absl::Status ResolveAndCheckLimits() {
    SBX_ASSIGN_OR_RETURN(limits_, ResolveLimits(spec_.resources));
    limits_.agent_memory_bytes = int64_t{s_.opts.agent_memory_mib} << 20;
    limits_.agent_pids = s_.opts.agent_pids;
    return s_.cgroups->CheckLimits(limits_);
  }

  // 3. The agent's argv and envp; later steps append the fds they open to argv.
  absl::Status PlanArgvAndEnv() {
    plan_.hostname = hostname_;
    plan_.agent_path = s_.opts.agent_path;
    plan_.agent_fd = s_.agent->fd();
    plan_.caps = &s_.caps;
    plan_.seccomp = &s_.seccomp;
    plan_.landlock = &s_.landlock;
    plan_.argv_storage = {"sbx-agent", "--listen-fd", std::to_string(kAgentListenFd), "--buffer-bytes",
                          std::to_string(s_.opts.agent_buffer_bytes), "--sandbox-id", spec_.id,
                          "--workdir", spec_.tmpl.workdir};
    std::map<std::string, std::string> env = {
        {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        {"HOME", "/root"},
        {"HOSTNAME", hostname_},
        {"LANG", "C.UTF-8"},
    };
    for (const auto& [k, v] : spec_.env) {
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
          v.find('\0') != std::string::npos) {
        return absl::InvalidArgumentError(fmt::format("create: invalid environment variable \"{}\"", k));
      }
      env[k] = v;
    }
    for (const auto& [k, v] : env) plan_.env_storage.push_back(fmt::format("{}={}", k, v));
    return absl::OkStatus();
  }

  // 4. <state>/sandboxes/<id> (0700) and its mount points; never a directory this call did
  //    not create.
  absl::Status MakeSandboxDir() {
    dir_owner_.emplace(dir_);
    return dir_owner_->Make();
  }

  // 5. The writable layer's hard cap: an ext4 image of exactly disk_mib (from the pool when the
  //    size matches; Take validates the size); unmounted and detached with the sandbox's mount
  //    namespace.
  absl::Status TakeDisk() {
    SBX_ASSIGN_OR_RETURN(disk_, s_.disks->Take(spec_.resources.disk_mib, dir_ + "/disk.img"));
    plan_.disk_fd = disk_.mount_fd();
    // A build step's changes are read from the disk itself, below the overlay: this fd stays
    // valid after the child attaches the mount in its namespace.
    if (spec_.keep_writable_layer) {
      upper_.Reset(::openat(disk_.mount_fd(), "upper",
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!upper_) return ErrnoStatus(errno, "create: openat(disk, \"upper\")");
    }
    return absl::OkStatus();
  }

  // 6a. The uid range and its user namespace, after the directory exists: a claim whose owner
  //     directory is missing counts as stale for every sbxd's sweep.
  absl::Status TakeUserNamespace() {
    if (!s_.opts.user_namespaces) return absl::OkStatus();
    SBX_ASSIGN_OR_RETURN(PreparedUserns prepared, s_.userns_pool->Take(dir_));
    uid_claim_.emplace(&s_.uid_ranges, prepared.base, dir_);
    userns_ = std::move(prepared.fd);
    return absl::OkStatus();
  }

  // 6b. The overlay's root directory is the upper's: owned by sandbox root like any root fs.
  //     The agent stays outside the namespace as its owner (userns.h, src/agent/identity.h).
  absl::Status ChownDiskAndPlanAgentIdentity() {
    if (!uid_claim_) return absl::OkStatus();
    const uint32_t base = uid_claim_->base();
    SBX_RETURN_IF_ERROR(Annotate(disk_.Chown(base, base), "user namespace"));
    uid_base_ = base;
    plan_.userns_fd = userns_.get();
    plan_.agent_uid = AgentUidOf(base);
    plan_.seccomp = &s_.agent_seccomp;
    plan_.argv_storage.insert(plan_.argv_storage.end(),
                              {"--userns-fd", std::to_string(kAgentUsernsFd), "--caps",
                               fmt::format("{:#x}", s_.caps.keep), "--uid-map",
                               fmt::format("{} {}", base, kGuestUidCount)});
    return absl::OkStatus();
  }

  // 7. Every path and option string of the child's mounts, so that the child only reads.
  absl::Status PlanMounts() {
    MountOptions mount_opts;
    if (spec_.resources.tmp_mib > 0) mount_opts.tmp_bytes = static_cast<size_t>(spec_.resources.tmp_mib) << 20;
    if (spec_.resources.shm_mib > 0) mount_opts.shm_bytes = static_cast<size_t>(spec_.resources.shm_mib) << 20;
    mount_opts.disk = true;
    mount_opts.uid_base = uid_base_;
    mount_opts.empty_dir = s_.view_empty_dir;
    if (!spec_.egress.is_null() || spec_.network_ready) {
      // Its own resolv.conf naming sbxd's resolver (ns_network.h), written at step 12b.
      TemplateSpec tmpl = spec_.tmpl;
      SBX_ASSIGN_OR_RETURN(BindMount resolv, PlanResolvConf(tmpl, dir_));
      tmpl.binds.push_back(std::move(resolv));
      SBX_ASSIGN_OR_RETURN(plan_.mounts, BuildMountPlan(tmpl, dir_, mount_opts));
    } else {
      SBX_ASSIGN_OR_RETURN(plan_.mounts, BuildMountPlan(spec_.tmpl, dir_, mount_opts));
    }
    plan_.nofile = static_cast<uint64_t>(spec_.resources.open_files > 0 ? spec_.resources.open_files : Resources{}.open_files);
    return absl::OkStatus();
  }

  // 8a. One directory per hierarchy, with the agent/ and work/ children and their limits.
  absl::Status MakeCgroups() {
    SBX_ASSIGN_OR_RETURN(cgroup_, s_.cgroups->Create(spec_.id, limits_));
    return absl::OkStatus();
  }

  // 8b. Split (cgroup.h): the agent goes to agent/, and every process it starts joins work/
  //     through fds opened here (write access to cgroup.procs is checked against the opener).
  absl::Status OpenCgroupFiles() {
    const bool into_cgroup = s_.cgroups->UseCloneIntoCgroup() && !cgroup_->v2_path().empty();
    const bool split = limits_.agent_memory_bytes > 0 || limits_.agent_pids > 0;
    // The agent's place in each directory: a child on pure v2, the directory itself on v1.
    const std::string agent_leaf = split ? cgroup_->agent_leaf() : "";
    auto leaf_of = [&](const std::string& dir) { return agent_leaf.empty() ? dir : fmt::format("{}/{}", dir, agent_leaf); };
    SBX_ASSIGN_OR_RETURN(procs_fds_, cgroup_->OpenProcsFiles(into_cgroup, agent_leaf));
    if (into_cgroup) {
      SBX_ASSIGN_OR_RETURN(v2_dir_, cgroup_->OpenV2Dir(agent_leaf));
      plan_.cgroup_v2_dir_fd = v2_dir_.get();
      plan_.cgroup_v2_path = leaf_of(cgroup_->v2_path());
    }
    for (const auto& d : cgroup_->dirs()) {
      if (d.v2 && into_cgroup) continue;
      plan_.cgroup_procs_paths.push_back(fmt::format("{}/cgroup.procs", leaf_of(d.path)));
    }
    for (const auto& fd : procs_fds_) plan_.cgroup_procs_fds.push_back(fd.get());
    if (!split) return absl::OkStatus();
    SBX_ASSIGN_OR_RETURN(work_fds_, cgroup_->OpenProcsFiles(/*skip_v2=*/false, kWorkLeaf));
    if (work_fds_.size() > kMaxAgentCgroupFds) {
      return absl::InternalError(fmt::format("create: {} cgroup hierarchies, the agent takes {}",
                                             work_fds_.size(), kMaxAgentCgroupFds));
    }
    for (size_t i = 0; i < work_fds_.size(); ++i) {
      plan_.agent_cgroup_fds.push_back(work_fds_[i].get());
      plan_.argv_storage.push_back("--cgroup-procs-fd");
      plan_.argv_storage.push_back(std::to_string(kAgentCgroupFdBase + static_cast<int>(i)));
    }
    return absl::OkStatus();
  }

  // 9. The agent tells an OOM kill from another SIGKILL by this counter (read-only: the file is
  //    host root's, and the fd gives no write access however it is reopened). The last
  //    addition to argv, which is final from here on.
  absl::Status OpenOomCounter() {
    if (const std::string oom_path = cgroup_->OomCounterPath(); !oom_path.empty()) {
      oom_fd_.Reset(::open(oom_path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!oom_fd_) return ErrnoStatus(errno, fmt::format("oom counter: open({})", oom_path));
      plan_.oom_fd = oom_fd_.get();
      plan_.argv_storage.push_back("--oom-counter-fd");
      plan_.argv_storage.push_back(std::to_string(kAgentOomFd));
    }
    plan_.FinalizeArrays();
    return absl::OkStatus();
  }

  // 10. Listening before the agent runs, so readiness is a plain ping.
  absl::Status ListenAgentSocket() {
    SBX_ASSIGN_OR_RETURN(listen_fd_, ListenUnix(socket_path_));
    plan_.listen_fd = listen_fd_.get();
    return absl::OkStatus();
  }

  // 11. The agent's stdout and stderr.
  absl::Status OpenAgentLog() {
    log_fd_.Reset(::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!log_fd_) return ErrnoStatus(errno, fmt::format("agent log: open({})", log_path_));
    plan_.log_fd = log_fd_.get();
    return absl::OkStatus();
  }

  // 12. From the pool, or none: then clone3 makes one. A networked sandbox (12b) needs the
  //     namespace before the launch, to build its veth in it: made here when the pool has none,
  //     and its network is attached before any process of the sandbox runs (ns_network.h).
  //     A network-ready warm-pool member (12c) gets a network no sandbox has claimed yet: it
  //     passes nothing until Instance::AttachEgress claims it at take.
  absl::Status TakeNetns() {
    if (spec_.network_ready) {
      SBX_ASSIGN_OR_RETURN(network_, PrebuildNetwork(s_.opts.network, spec_.id,
                                                     s_.netns_pool.get(), &netns_));
      SBX_RETURN_IF_ERROR(WriteResolvConf(dir_, *network_));
    } else if (spec_.egress.is_null()) {
      netns_ = s_.netns_pool ? s_.netns_pool->Take() : UniqueFd();
    } else {
      SBX_ASSIGN_OR_RETURN(network_, AttachNetwork(s_.opts.network, spec_.id, spec_.egress,
                                                   s_.netns_pool.get(), &netns_));
      SBX_RETURN_IF_ERROR(WriteResolvConf(dir_, *network_));
    }
    plan_.netns_fd = netns_ ? netns_.get() : -1;
    return absl::OkStatus();
  }

  // 13. clone3 and the child's steps (launcher.cc), up to the agent's exec.
  absl::Status LaunchAgent() {
    SBX_ASSIGN_OR_RETURN(child_, Launch(plan_));
    netns_.Reset();  // the sandbox's processes hold it now
    return absl::OkStatus();
  }

  // 14. Only the agent may hold the listening socket now: if it dies, connects fail at once
  //     instead of waiting for the readiness timeout.
  void DropParentCopies() {
    listen_fd_.Reset();
    log_fd_.Reset();
    oom_fd_.Reset();
    disk_.Release();  // the sandbox's mount namespace holds it now; Destroy removes disk.img
    procs_fds_.clear();
    work_fds_.clear();
    v2_dir_.Reset();
  }

  // 15. The agent's first ping answer; if it died, how it ended and the end of its log.
  absl::Status WaitForAgent() {
    auto ping = protocol::CallAgent(socket_path_, Json{{"op", "ping"}}, kAgentReadyTimeoutMs);
    if (ping.ok()) return absl::OkStatus();
    std::string exited;
    // The socket closes while the agent is still exiting: give the exit a moment to complete
    // (failure path only) so the message can say how it ended.
    struct pollfd pfd{child_.pidfd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
    siginfo_t info;
    std::memset(&info, 0, sizeof(info));
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(child_.pidfd()), &info,
                 WEXITED | WNOHANG) == 0 && info.si_pid != 0) {
      exited = info.si_code == CLD_EXITED
                   ? fmt::format("agent exited during start-up with status {}; ", info.si_status)
                   : fmt::format("agent was killed by signal {} during start-up; ", info.si_status);
    }
    std::string tail = LogTail(log_path_);
    return absl::Status(ping.status().code(),
                        fmt::format("wait for agent: {}ping on {}: {}{}", exited, socket_path_,
                                    std::string(ping.status().message()),
                                    tail.empty() ? "" : fmt::format(" (agent.log: {})", tail)));
  }

  // 16. The agent's start time (a pid plus its start time names one process), then the owners
  //     of the directory, the uid claim, the cgroups and the child are released to the instance.
  absl::StatusOr<InstancePtr> Record(std::shared_ptr<NsBackend::Shared> shared) {
    auto start_time = ProcessStartTime(child_.pid());
    if (!start_time.ok()) return Annotate(start_time.status(), "create: read agent start time");
    pid_ = child_.pid();
    UniqueFd pidfd = child_.Release();
    dir_owner_->Release();
    uint32_t uid_base = 0;
    if (uid_claim_) {
      uid_base = uid_claim_->base();
      uid_claim_->Release();
    }
    return MakeNsInstance(std::move(shared), spec_.id, pid_, *start_time, std::move(pidfd),
                          std::move(cgroup_), uid_base, std::move(network_), std::move(upper_));
  }

 private:
  const NsBackend::Shared& s_;
  const SandboxSpec& spec_;
  const std::string dir_;
  const std::string socket_path_;
  const std::string log_path_;
  std::string hostname_;
  CgroupLimits limits_;
  uint32_t uid_base_ = 0;  // 0 without a user namespace
  LaunchPlan plan_;
  pid_t pid_ = -1;
  // The owners, in creation order (destroyed in reverse).
  std::optional<SandboxDirOwner> dir_owner_;
  std::optional<UidClaim> uid_claim_;
  UniqueFd userns_;
  PreparedDisk disk_;
  UniqueFd upper_;  // keep_writable_layer: the disk's upper directory
  std::unique_ptr<SandboxCgroup> cgroup_;
  std::vector<UniqueFd> procs_fds_;
  UniqueFd v2_dir_;
  std::vector<UniqueFd> work_fds_;
  UniqueFd oom_fd_;
  UniqueFd listen_fd_;
  UniqueFd log_fd_;
  UniqueFd netns_;
  std::unique_ptr<net::SandboxNetwork> network_;  // 12b, networked sandboxes only
  ChildProcess child_;
};

}  // namespace


NsBackend::NsBackend(NsOptions options) : shared_(std::make_shared<Shared>()) {
  Shared& s = *shared_;
  s.opts = std::move(options);
  if (s.opts.agent_buffer_bytes == 0) s.opts.agent_buffer_bytes = protocol::kDefaultOutputBufferBytes;
  s.sandboxes_dir = fmt::format("{}/sandboxes", s.opts.state_dir);

  auto agent = AgentImage::Load(s.opts.agent_path);
  if (agent.ok()) {
    s.agent.emplace(std::move(*agent));
  } else {
    s.agent_status = agent.status();
  }
  auto seccomp = s.opts.seccomp_policy_path.empty() ? BuildSeccompProgram()
                                                    : BuildSeccompProgramFromFile(s.opts.seccomp_policy_path);
  auto agent_seccomp = s.opts.seccomp_policy_path.empty()
                           ? BuildSeccompProgram(SeccompFor::kAgent)
                           : BuildSeccompProgramFromFile(s.opts.seccomp_policy_path, SeccompFor::kAgent);
  if (seccomp.ok() && agent_seccomp.ok()) {
    s.seccomp = std::move(*seccomp);
    s.agent_seccomp = std::move(*agent_seccomp);
  } else {
    s.seccomp_status = seccomp.ok() ? agent_seccomp.status() : seccomp.status();
  }
  s.landlock = BuildLandlockPlan();
  spdlog::info("ns runtime: {}", DescribeLandlockPlan(s.landlock));
  auto caps = BuildCapsPlan();
  if (caps.ok()) {
    s.caps = *caps;
  } else {
    s.caps_status = caps.status();
  }

  CgroupEnv env;
  env.proc_root = s.opts.proc_root;
  env.cgroupfs_root = s.opts.cgroup_root_override;
  env.parent = s.opts.cgroup_parent;
  absl::StatusOr<std::unique_ptr<CgroupDriver>> driver = MakeCgroupDriver(env);
  if (driver.ok()) {
    s.cgroups = std::move(*driver);
    s.cgroup_status = s.cgroups->Setup();
    if (s.cgroup_status.ok() && s.opts.cgroup_favor_dynmods && s.cgroups->JoinsByWritingProcs()) {
      // Only a speed-up: a kernel without it still works, one RCU grace period slower per launch.
      absl::Status fav = EnableCgroupFavorDynmods(s.opts.proc_root);
      if (fav.ok()) {
        spdlog::info("ns runtime: cgroup2 mounted with favordynmods (cgroup joins without an RCU grace period)");
      } else {
        spdlog::warn("ns runtime: {}; cgroup joins stay slower", std::string(fav.message()));
      }
    }
  } else {
    s.cgroup_status = driver.status();
  }

  if (s.opts.state_dir.empty() || s.opts.state_dir[0] != '/') {
    s.state_status = absl::InvalidArgumentError(
        fmt::format("ns runtime: state_dir must be an absolute path, got \"{}\"", s.opts.state_dir));
  } else {
    s.state_status = Annotate(MkdirAll(s.sandboxes_dir, 0700), "ns runtime: state dir");
    // One for all sandboxes: a directory per sandbox on the state dir's file system cost a
    // create its mkdir and a delete its rmdir.
    s.view_empty_dir = fmt::format("{}/view-empty", s.opts.state_dir);
    if (s.state_status.ok()) s.state_status = Annotate(MakeEmptyDir(s.view_empty_dir, 0555), "ns runtime: state dir");
  }
  s.uid_ranges = UidRanges(s.opts.uid_claim_dir);
  if (s.opts.user_namespaces && s.state_status.ok()) {
    s.userns_status = s.uid_ranges.Init();
    if (s.userns_status.ok()) s.userns_status = ProbeIdmap(s.sandboxes_dir);
    // Ranges pooled by an earlier run of this sbxd that died are nobody's now.
    const std::string pool_owner = fmt::format("{}/uid-pool", s.opts.state_dir);
    if (s.userns_status.ok()) s.userns_status = Annotate(MkdirAll(pool_owner, 0700), "uid range pool");
    if (s.userns_status.ok()) s.userns_status = s.uid_ranges.ReleaseOwner(pool_owner);
    s.userns_pool = std::make_unique<UsernsPool>(&s.uid_ranges, pool_owner, s.opts.userns_pool_size);
  }
  if (s.state_status.ok()) {
    s.disks = std::make_unique<DiskProvider>(s.opts.state_dir, s.opts.disk_pool_size, s.opts.disk_pool_mib);
    s.disk_status = s.disks->Probe();
    // This state dir's disk-images/ is only ours; loop devices still mounted (sandboxes that
    // outlived an sbxd) are left alone by the sweep.
    if (s.disk_status.ok()) s.disk_status = Annotate(s.disks->Sweep(), "disk images");
  }
  if (!s.Ready().ok()) {
    spdlog::warn("ns runtime not usable: {}", std::string(s.Ready().message()));
  } else if (s.opts.netns_pool_size > 0) {
    s.netns_pool = std::make_unique<NetnsPool>(s.opts.netns_pool_size, s.opts.network);
    s.netns_pool->Start();
  }
  if (s.Ready().ok()) {
    // Only a speed-up: without the pool each launch makes its cgroups.
    absl::StatusOr<int> pooled =
        s.cgroups->StartPool(s.opts.cgroup_pool_size, CgroupPoolTag(s.opts.state_dir));
    if (!pooled.ok()) {
      spdlog::warn("ns runtime: cgroup pool: {}; launches make their cgroups",
                   std::string(pooled.status().message()));
    } else if (*pooled > 0) {
      spdlog::info("ns runtime: {} cgroup sets of {} directories kept ready", s.opts.cgroup_pool_size, *pooled);
    }
  }
  if (s.Ready().ok() && s.opts.disk_pool_size > 0) s.disks->Start();
  if (s.Ready().ok() && s.userns_pool) s.userns_pool->Start();
  if (s.opts.removal_backlog > 0) s.reaper = std::make_unique<Reaper>(s.opts.removal_backlog);
}

NsBackend::~NsBackend() = default;

Capabilities NsBackend::GetCapabilities() const {
  Capabilities caps;
  caps.pause = shared_->cgroups != nullptr && shared_->cgroups->CanFreeze();
  caps.network_ready = shared_->opts.network != nullptr;
  caps.template_builds = true;
  return caps;
}

std::map<std::string, std::string> NsBackend::CgroupPaths(const std::string& id) const {
  std::map<std::string, std::string> out;
  if (!shared_->cgroups) return out;
  for (const auto& d : shared_->cgroups->SandboxDirs(id)) out[d.key] = d.path;
  return out;
}

std::string NsBackend::SandboxDir(const std::string& id) const { return shared_->DirOf(id); }

std::string NsBackend::CgroupDriverName() const {
  return shared_->cgroups ? shared_->cgroups->Name() : "";
}

absl::Status NsBackend::Probe() {
  const Shared& s = *shared_;
  std::vector<std::string> problems;
  if (::geteuid() != 0) {
    problems.push_back(
        "not running as root: the ns runtime mounts, creates namespaces and cgroups; run sbxd as "
        "root (or pick another runtime)");
  }
  for (const absl::Status& st : {ProbeOverlayfs(s.opts.proc_root), ProbeClone3(), ProbeCloseRangeCloexec()}) {
    if (!st.ok()) problems.push_back(std::string(st.message()));
  }
  if (!s.cgroup_status.ok()) {
    problems.push_back(fmt::format("cgroups: {}", std::string(s.cgroup_status.message())));
  } else if (absl::Status c = s.cgroups->CheckLimits(*ResolveLimits(Resources{})); !c.ok()) {
    problems.push_back(std::string(c.message()));
  }
  if (!s.agent_status.ok()) {
    problems.push_back(fmt::format("{} (build it with `ninja sbx-agent`, set the agent path)",
                                   std::string(s.agent_status.message())));
  }
  if (!s.state_status.ok()) problems.push_back(std::string(s.state_status.message()));
  if (!s.userns_status.ok()) problems.push_back(std::string(s.userns_status.message()));
  if (!s.disk_status.ok()) problems.push_back(fmt::format("disk caps: {}", std::string(s.disk_status.message())));
  if (!s.seccomp_status.ok()) problems.push_back(std::string(s.seccomp_status.message()));
  if (!s.caps_status.ok()) problems.push_back(std::string(s.caps_status.message()));
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      fmt::format("ns runtime unavailable: {}", fmt::join(problems, "; ")));
}

// The steps of docs/isolation.md §2.2, in order; the owners they build unwind in reverse when
// one fails. `trace` only times them (the debug log).
absl::StatusOr<InstancePtr> NsBackend::Create(const SandboxSpec& spec) {
  CreateTrace trace;
  SBX_RETURN_IF_ERROR(shared_->Ready());
  Creation c(*shared_, spec);
  SBX_RETURN_IF_ERROR(c.Validate());                                                           // 1
  SBX_RETURN_IF_ERROR(c.ResolveAndCheckLimits());                                              // 2
  SBX_RETURN_IF_ERROR(c.PlanArgvAndEnv());                                                     // 3
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kMkdir, c.MakeSandboxDir()));                   // 4
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kDisk, c.TakeDisk()));                          // 5
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kUsernsTaken, c.TakeUserNamespace()));          // 6
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kUserns, c.ChownDiskAndPlanAgentIdentity()));
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kPlanned, c.PlanMounts()));                     // 7
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kCgroups, c.MakeCgroups()));                    // 8
  SBX_RETURN_IF_ERROR(c.OpenCgroupFiles());
  SBX_RETURN_IF_ERROR(c.OpenOomCounter());                                                     // 9
  SBX_RETURN_IF_ERROR(c.ListenAgentSocket());                                                  // 10
  SBX_RETURN_IF_ERROR(c.OpenAgentLog());                                                       // 11
  trace.ShareWithChild(c.plan());
  SBX_RETURN_IF_ERROR(c.TakeNetns());                                                          // 12
  trace.After(CreateTrace::kPrepared);
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kExec, c.LaunchAgent()));                       // 13
  trace.LogChildMilestones(spec.id, c.plan());
  c.DropParentCopies();                                                                        // 14
  SBX_RETURN_IF_ERROR(trace.After(CreateTrace::kReady, c.WaitForAgent()));                     // 15
  SBX_ASSIGN_OR_RETURN(InstancePtr instance, c.Record(shared_));                               // 16
  trace.LogCreated(spec.id, c.pid());
  return instance;
}

HostShare NsBackend::Share() const {
  HostShare out;
  const Shared& s = *shared_;
  if (s.cgroup_status.ok() && s.cgroups) {
    const CgroupCeiling c = ReadCgroupCeiling(s.cgroups->ParentDirs());
    out.memory_limit_mib = c.memory_bytes >> 20;
    out.cpu_quota_millis = c.cpu_millis;
  }
  // Every sandbox's disk image (warm-pool members included); st_blocks counts 512-byte units
  // whatever the file system's block size.
  auto names = ListDir(s.sandboxes_dir);
  if (names.ok()) {
    int64_t bytes = 0;
    for (const auto& n : *names) {
      struct stat st {};
      if (::stat(fmt::format("{}/{}/disk.img", s.sandboxes_dir, n).c_str(), &st) == 0) {
        bytes += static_cast<int64_t>(st.st_blocks) * 512;
      }
    }
    out.disk_allocated_mib = bytes >> 20;
  }
  return out;
}

void NsBackend::OnDefaultsChanged(const Resources& defaults) {
  if (shared_->disks) shared_->disks->SetPoolSizeMib(defaults.disk_mib);
}

}  // namespace sbx::runtime::ns
