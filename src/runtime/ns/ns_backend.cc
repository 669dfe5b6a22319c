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
#include "runtime/ns/net_counters.h"
#include "runtime/ns/netns_pool.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/launcher.h"
#include "runtime/ns/mounts.h"
#include "runtime/ns/disk_image.h"
#include "runtime/ns/landlock.h"
#include "runtime/ns/seccomp.h"
#include "runtime/ns/userns.h"

namespace sbx::runtime::ns {

namespace {

constexpr char kIdPrefix[] = "sbx";
constexpr char kSocketName[] = "agent.sock";
constexpr char kLogName[] = "agent.log";
constexpr int kListenBacklog = 128;

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

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
    // upper and work live on the sandbox's disk (disk_image.h), mounted at `disk`.
    for (const char* sub : {"disk", "rootfs", "lower"}) {
      std::string p = fmt::format("{}/{}", path_, sub);
      if (::mkdir(p.c_str(), 0755) != 0) return ErrnoStatus(errno, fmt::format("sandbox dir: mkdir({})", p));
    }
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

}  // namespace

// Everything built once per backend and shared (read-only) by every Create and every instance.
struct NsBackend::Shared {
  NsOptions opts;
  std::string sandboxes_dir;
  absl::Status state_status = absl::OkStatus();
  absl::Status agent_status = absl::OkStatus();
  std::optional<AgentImage> agent;
  absl::Status seccomp_status = absl::OkStatus();
  SeccompProgram seccomp;
  // The agent's own filter when it stays outside the sandbox's user namespace (identity.h).
  SeccompProgram agent_seccomp;
  LandlockPlan landlock;  // abi 0: not used
  absl::Status caps_status = absl::OkStatus();
  CapsPlan caps;
  absl::Status cgroup_status = absl::OkStatus();
  std::unique_ptr<CgroupDriver> cgroups;
  std::unique_ptr<NetnsPool> netns_pool;  // null when NsOptions::netns_pool_size is 0
  absl::Status userns_status = absl::OkStatus();
  absl::Status disk_status = absl::OkStatus();
  std::unique_ptr<DiskProvider> disks;
  // Host-wide claims of uid ranges; meaningful only with opts.user_namespaces. Its methods
  // touch only files, so the const Shared& of Create may use it.
  mutable UidRanges uid_ranges;
  std::unique_ptr<UsernsPool> userns_pool;  // after uid_ranges: destroyed before it

  std::string DirOf(const std::string& id) const { return fmt::format("{}/{}", sandboxes_dir, id); }

  absl::Status Ready() const {
    SBX_RETURN_IF_ERROR(state_status);
    SBX_RETURN_IF_ERROR(agent_status);
    SBX_RETURN_IF_ERROR(seccomp_status);
    SBX_RETURN_IF_ERROR(caps_status);
    SBX_RETURN_IF_ERROR(cgroup_status);
    SBX_RETURN_IF_ERROR(userns_status);
    SBX_RETURN_IF_ERROR(disk_status);
    return absl::OkStatus();
  }
};

namespace {

class NsInstance : public Instance {
 public:
  NsInstance(std::shared_ptr<NsBackend::Shared> shared, std::string id, pid_t pid,
             uint64_t start_time, UniqueFd pidfd, std::unique_ptr<SandboxCgroup> cgroup,
             uint32_t uid_base)
      : shared_(std::move(shared)),
        id_(std::move(id)),
        dir_(shared_->DirOf(id_)),
        socket_(fmt::format("{}/{}", dir_, kSocketName)),
        pid_(pid),
        start_time_(start_time),
        pidfd_(std::move(pidfd)),
        cgroup_(std::move(cgroup)),
        uid_base_(uid_base) {
    cgroup_->Release();  // the sandbox outlives this object (and sbxd); Destroy() is explicit
  }

  const std::string& id() const override { return id_; }
  std::string AgentSocketPath() const override { return socket_; }

  Json Persist() const override {
    return Json{{"pid", pid_},
                {"start_time", start_time_},
                {"cgroups", cgroup_->ToJson()},
                {"cgroup_driver", shared_->cgroups ? shared_->cgroups->Name() : ""},
                {"dir", dir_},
                {"socket", socket_},
                {"uid_base", uid_base_}};
  }

  bool Alive() const override {
    if (destroyed_ || !pidfd_) return false;
    // A pidfd polls readable once the process has exited.
    struct pollfd pfd{pidfd_.get(), POLLIN, 0};
    return ::poll(&pfd, 1, 0) == 0;
  }

  std::string DeathReason() const override {
    std::string how = "it exited";
    if (pidfd_) {
      // WNOWAIT: Destroy() still reaps it. ECHILD: not our child (adopted after a restart).
      siginfo_t info;
      std::memset(&info, 0, sizeof(info));
      if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                   WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0) {
        how = info.si_code == CLD_EXITED
                  ? fmt::format("it exited with status {}", info.si_status)
                  : fmt::format("it was killed by {}", protocol::SignalName(info.si_status)
                                                              .value_or(fmt::format("signal {}", info.si_status)));
      }
    }
    // The agent's own cgroup (split sandboxes) counts what the OOM killer took there: v1's
    // memory hierarchy where there is one (hybrid hosts), else v2's.
    if (cgroup_ && cgroup_->Split()) {
      std::string file;
      for (const auto& d : cgroup_->dirs()) {
        if (d.key == "memory" && !d.v2) file = fmt::format("{}/{}/memory.oom_control", d.path, kAgentLeaf);
      }
      if (file.empty() && !cgroup_->v2_path().empty()) {
        file = fmt::format("{}/{}/memory.events", cgroup_->v2_path(), kAgentLeaf);
      }
      auto text = file.empty() ? absl::StatusOr<std::string>(absl::NotFoundError("")) : ReadFileToString(file);
      const size_t at = text.ok() ? text->find("oom_kill ") : std::string::npos;
      if (at != std::string::npos && std::strtoull(text->c_str() + at + 9, nullptr, 10) > 0) {
        how += "; the OOM killer took it: its memory limit (runtime.ns.agent_memory_mib) was reached";
      }
    }
    return how;
  }

  absl::StatusOr<uint64_t> DeniedEgress() const override {
    if (!Alive()) {
      return absl::FailedPreconditionError(fmt::format("denied egress {}: agent not alive", id_));
    }
    auto n = ReadNoRouteCount(pid_);
    // The pid names our agent only while it exists: alive after the read, it was the agent's.
    if (n.ok() && !Alive()) {
      return absl::FailedPreconditionError(fmt::format("denied egress {}: agent exited", id_));
    }
    return n;
  }

  absl::Status Destroy() override {
    if (destroyed_) return absl::OkStatus();
    const auto t0 = Clock::now();
    // 1. The agent is PID 1 of the sandbox's pid namespace: when it dies the kernel SIGKILLs
    //    every other process in the namespace.
    if (pidfd_) {
      if (PidfdSendSignal(pidfd_.get(), SIGKILL) != 0 && errno != ESRCH) {
        return ErrnoStatus(errno, fmt::format("destroy {}: pidfd_send_signal(SIGKILL)", id_));
      }
    }
    // 2. Anything that is in the cgroups but not in the namespace (should be nothing).
    absl::Status kill = cgroup_->Kill();
    if (!kill.ok()) spdlog::warn("ns: destroy {}: {}", id_, std::string(kill.message()));
    // 3. Reap the agent (our child unless adopted); its exit completes only after the kernel
    //    reaped every other process of the namespace.
    if (pidfd_) {
      if (!WaitPidfdExit(pidfd_.get(), static_cast<int>(kCgroupDrainTimeout.count()))) {
        return absl::DeadlineExceededError(fmt::format(
            "destroy {}: agent pid {} still alive {} ms after SIGKILL", id_, pid_,
            kCgroupDrainTimeout.count()));
      }
      pidfd_.Reset();
    }
    const auto t_reaped = Clock::now();
    // 4-5. Wait for the cgroups to empty, remove them.
    SBX_RETURN_IF_ERROR(Annotate(cgroup_->Destroy(), fmt::format("destroy {}", id_)));
    const auto t_cgroups = Clock::now();
    // 6. The uid range: free for another sandbox now that no process of this one is left.
    if (uid_base_ != 0) {
      SBX_RETURN_IF_ERROR(Annotate(shared_->uid_ranges.Release(uid_base_, dir_), fmt::format("destroy {}", id_)));
    }
    // 7. The sandbox's files (upper layer, socket, log). The mounts lived only in the
    //    sandbox's mount namespace, which died with its last process.
    SBX_RETURN_IF_ERROR(Annotate(RemoveTree(dir_), fmt::format("destroy {}", id_)));
    destroyed_ = true;
    spdlog::debug("ns: destroyed {} in {:.2f} ms: kill+reap {:.2f}, cgroups {:.2f}, files {:.2f}",
                  id_, MsSince(t0), std::chrono::duration<double, std::milli>(t_reaped - t0).count(),
                  std::chrono::duration<double, std::milli>(t_cgroups - t_reaped).count(),
                  MsSince(t_cgroups));
    return absl::OkStatus();
  }

  // Pause is the cgroup freezer (cgroup_freezer.cc). The agent freezes with the rest: its
  // socket stays connected, and what sbxd asks meanwhile waits in the socket buffers.
  absl::Status Freeze() override {
    const auto t0 = Clock::now();
    absl::Status st = cgroup_->Freeze(t0 + kCgroupFreezeTimeout);
    if (!st.ok()) {
      // A half-frozen sandbox is neither paused nor usable: undo, report the freeze error.
      absl::Status undo = cgroup_->Thaw(Clock::now() + kCgroupFreezeTimeout);
      if (!undo.ok()) spdlog::error("ns: {}: undo of a failed freeze: {}", id_, std::string(undo.message()));
      return st;
    }
    spdlog::debug("ns: froze {} in {:.2f} ms", id_, MsSince(t0));
    return absl::OkStatus();
  }

  absl::Status Thaw() override {
    const auto t0 = Clock::now();
    SBX_RETURN_IF_ERROR(cgroup_->Thaw(t0 + kCgroupFreezeTimeout));
    spdlog::debug("ns: thawed {} in {:.2f} ms", id_, MsSince(t0));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> IsFrozen() const override { return cgroup_->FreezeRequested(); }

 private:
  std::shared_ptr<NsBackend::Shared> shared_;
  std::string id_;
  std::string dir_;
  std::string socket_;
  pid_t pid_;
  uint64_t start_time_;
  UniqueFd pidfd_;
  std::unique_ptr<SandboxCgroup> cgroup_;
  uint32_t uid_base_;  // 0 without a user namespace
  bool destroyed_ = false;
};

// Opens a pidfd for `pid` only if it is still the process that started at `start_time`.
absl::StatusOr<UniqueFd> OpenVerifiedPidfd(pid_t pid, uint64_t start_time) {
  auto st = ProcessStartTime(pid);
  if (!st.ok() || *st != start_time) {
    return absl::NotFoundError(fmt::format("agent pid {} is gone (or was reused)", pid));
  }
  UniqueFd fd(PidfdOpen(pid));
  if (!fd) {
    if (errno == ESRCH) return absl::NotFoundError(fmt::format("agent pid {} is gone", pid));
    return ErrnoStatus(errno, fmt::format("adopt: pidfd_open({})", pid));
  }
  // The pid could have been recycled between the check and pidfd_open: check again, now that
  // the fd pins whatever process it names.
  st = ProcessStartTime(pid);
  if (!st.ok() || *st != start_time) {
    return absl::NotFoundError(fmt::format("agent pid {} is gone (or was reused)", pid));
  }
  return fd;
}

}  // namespace

NsBackend::NsBackend(NsOptions options) : shared_(std::make_shared<Shared>()) {
  Shared& s = *shared_;
  s.opts = std::move(options);
  if (s.opts.agent_buffer_bytes == 0) s.opts.agent_buffer_bytes = kDefaultAgentBufferBytes;
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
    s.netns_pool = std::make_unique<NetnsPool>(s.opts.netns_pool_size);
    s.netns_pool->Start();
  }
  if (s.Ready().ok() && s.opts.disk_pool_size > 0) s.disks->Start();
  if (s.Ready().ok() && s.userns_pool) s.userns_pool->Start();
}

NsBackend::~NsBackend() = default;

Capabilities NsBackend::GetCapabilities() const {
  Capabilities caps;
  caps.pause = shared_->cgroups != nullptr && shared_->cgroups->CanFreeze();
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

absl::StatusOr<InstancePtr> NsBackend::Create(const SandboxSpec& spec) {
  const auto t0 = Clock::now();
  const Shared& s = *shared_;
  SBX_RETURN_IF_ERROR(s.Ready());
  if (!IsValidId(spec.id, kIdPrefix)) {
    return absl::InvalidArgumentError(fmt::format("create: invalid sandbox id \"{}\"", spec.id));
  }
  const std::string hostname = spec.hostname.empty() ? spec.id.substr(0, 12) : spec.hostname;
  if (!ValidHostname(hostname)) {
    return absl::InvalidArgumentError(fmt::format("create: invalid hostname \"{}\"", hostname));
  }
  SBX_ASSIGN_OR_RETURN(CgroupLimits limits, ResolveLimits(spec.resources));
  limits.agent_memory_bytes = int64_t{s.opts.agent_memory_mib} << 20;
  limits.agent_pids = s.opts.agent_pids;
  SBX_RETURN_IF_ERROR(s.cgroups->CheckLimits(limits));

  const std::string dir = s.DirOf(spec.id);
  const std::string socket_path = fmt::format("{}/{}", dir, kSocketName);
  const std::string log_path = fmt::format("{}/{}", dir, kLogName);

  LaunchPlan plan;
  plan.hostname = hostname;
  plan.agent_path = s.opts.agent_path;
  plan.agent_fd = s.agent->fd();
  plan.caps = &s.caps;
  plan.seccomp = &s.seccomp;
  plan.landlock = &s.landlock;
  plan.argv_storage = {"sbx-agent", "--listen-fd", std::to_string(kAgentListenFd), "--buffer-bytes",
                       std::to_string(s.opts.agent_buffer_bytes), "--sandbox-id", spec.id,
                       "--workdir", spec.tmpl.workdir};
  std::map<std::string, std::string> env = {
      {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
      {"HOME", "/root"},
      {"HOSTNAME", hostname},
      {"LANG", "C.UTF-8"},
  };
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(fmt::format("create: invalid environment variable \"{}\"", k));
    }
    env[k] = v;
  }
  for (const auto& [k, v] : env) plan.env_storage.push_back(fmt::format("{}={}", k, v));

  // Owners in creation order; on any error below they unwind in reverse.
  SandboxDirOwner dir_owner(dir);
  SBX_RETURN_IF_ERROR(dir_owner.Make());
  std::optional<UidClaim> uid_claim;
  UniqueFd userns;
  MountOptions mount_opts;
  if (spec.resources.tmp_mib > 0) mount_opts.tmp_bytes = static_cast<size_t>(spec.resources.tmp_mib) << 20;
  if (spec.resources.shm_mib > 0) mount_opts.shm_bytes = static_cast<size_t>(spec.resources.shm_mib) << 20;
  mount_opts.disk = true;
  // The writable layer's hard cap: an ext4 image of exactly disk_mib (from the pool when the
  // size matches; Take validates the size); unmounted and detached with the sandbox's mount
  // namespace.
  const auto t_mkdir = Clock::now();
  SBX_ASSIGN_OR_RETURN(PreparedDisk disk, s.disks->Take(spec.resources.disk_mib, dir + "/disk.img"));
  plan.disk_fd = disk.mount_fd();
  const auto t_disk = Clock::now();
  auto t_take = Clock::now();
  if (s.opts.user_namespaces) {
    // After the directory exists: a claim whose owner directory is missing counts as stale for
    // every sbxd's sweep.
    SBX_ASSIGN_OR_RETURN(PreparedUserns prepared, s.userns_pool->Take(dir));
    const uint32_t base = prepared.base;
    uid_claim.emplace(&s.uid_ranges, base, dir);
    userns = std::move(prepared.fd);
    t_take = Clock::now();
    // The overlay's root directory is the upper's: owned by sandbox root like any root fs.
    SBX_RETURN_IF_ERROR(Annotate(disk.Chown(base, base), "user namespace"));
    mount_opts.uid_base = base;
    plan.userns_fd = userns.get();
    // The agent stays outside the namespace as its owner (userns.h, src/agent/identity.h).
    plan.agent_uid = AgentUidOf(base);
    plan.seccomp = &s.agent_seccomp;
    plan.argv_storage.insert(plan.argv_storage.end(),
                             {"--userns-fd", std::to_string(kAgentUsernsFd), "--caps",
                              fmt::format("{:#x}", s.caps.keep), "--uid-map",
                              fmt::format("{} {}", base, kGuestUidCount)});
  }
  const auto t_userns = Clock::now();
  SBX_ASSIGN_OR_RETURN(plan.mounts, BuildMountPlan(spec.tmpl, dir, mount_opts));
  plan.nofile = static_cast<uint64_t>(spec.resources.open_files > 0 ? spec.resources.open_files : Resources{}.open_files);
  const auto t_dir = Clock::now();
  SBX_ASSIGN_OR_RETURN(std::unique_ptr<SandboxCgroup> cgroup, s.cgroups->Create(spec.id, limits));
  const auto t_cg = Clock::now();
  const bool into_cgroup = s.cgroups->UseCloneIntoCgroup() && !cgroup->v2_path().empty();
  // Split (cgroup.h): the agent goes to agent/, and every process it starts joins work/
  // through fds opened here (write access to cgroup.procs is checked against the opener).
  const bool split = limits.agent_memory_bytes > 0 || limits.agent_pids > 0;
  const std::string agent_leaf = split ? kAgentLeaf : "";
  auto leaf_of = [&](const std::string& dir) { return split ? fmt::format("{}/{}", dir, kAgentLeaf) : dir; };
  SBX_ASSIGN_OR_RETURN(std::vector<UniqueFd> procs_fds, cgroup->OpenProcsFiles(into_cgroup, agent_leaf));
  UniqueFd v2_dir;
  if (into_cgroup) {
    SBX_ASSIGN_OR_RETURN(v2_dir, cgroup->OpenV2Dir(agent_leaf));
    plan.cgroup_v2_dir_fd = v2_dir.get();
    plan.cgroup_v2_path = leaf_of(cgroup->v2_path());
  }
  for (const auto& d : cgroup->dirs()) {
    if (d.v2 && into_cgroup) continue;
    plan.cgroup_procs_paths.push_back(fmt::format("{}/cgroup.procs", leaf_of(d.path)));
  }
  for (const auto& fd : procs_fds) plan.cgroup_procs_fds.push_back(fd.get());
  std::vector<UniqueFd> work_fds;
  if (split) {
    SBX_ASSIGN_OR_RETURN(work_fds, cgroup->OpenProcsFiles(/*skip_v2=*/false, kWorkLeaf));
    if (work_fds.size() > kMaxAgentCgroupFds) {
      return absl::InternalError(fmt::format("create: {} cgroup hierarchies, the agent takes {}",
                                             work_fds.size(), kMaxAgentCgroupFds));
    }
    for (size_t i = 0; i < work_fds.size(); ++i) {
      plan.agent_cgroup_fds.push_back(work_fds[i].get());
      plan.argv_storage.push_back("--cgroup-procs-fd");
      plan.argv_storage.push_back(std::to_string(kAgentCgroupFdBase + static_cast<int>(i)));
    }
  }
  // The agent tells an OOM kill from another SIGKILL by this counter (read-only: the file is
  // host root's, and the fd gives no write access however it is reopened).
  UniqueFd oom_fd;
  if (const std::string oom_path = cgroup->OomCounterPath(); !oom_path.empty()) {
    oom_fd.Reset(::open(oom_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!oom_fd) return ErrnoStatus(errno, fmt::format("oom counter: open({})", oom_path));
    plan.oom_fd = oom_fd.get();
    plan.argv_storage.push_back("--oom-counter-fd");
    plan.argv_storage.push_back(std::to_string(kAgentOomFd));
  }
  plan.FinalizeArrays();

  SBX_ASSIGN_OR_RETURN(UniqueFd listen_fd, ListenUnix(socket_path));
  plan.listen_fd = listen_fd.get();
  UniqueFd log_fd(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log_fd) return ErrnoStatus(errno, fmt::format("agent log: open({})", log_path));
  plan.log_fd = log_fd.get();

  // Debug builds of the log show where the child spends its time (a shared page the child
  // writes timestamps into; no cost otherwise).
  void* trace_page = MAP_FAILED;
  if (spdlog::should_log(spdlog::level::debug)) {
    trace_page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (trace_page != MAP_FAILED) {
      plan.trace = static_cast<uint64_t*>(trace_page);
      plan.mounts.trace = plan.trace;
    }
  }
  struct TraceUnmap {
    void* p;
    ~TraceUnmap() {
      if (p != MAP_FAILED) ::munmap(p, 4096);
    }
  } trace_unmap{trace_page};

  UniqueFd netns = s.netns_pool ? s.netns_pool->Take() : UniqueFd();
  plan.netns_fd = netns ? netns.get() : -1;

  const auto t_prep = Clock::now();
  SBX_ASSIGN_OR_RETURN(ChildProcess child, Launch(plan));
  netns.Reset();  // the sandbox's processes hold it now
  const auto t_exec = Clock::now();
  if (plan.trace != nullptr) {
    const uint64_t base = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t_prep.time_since_epoch()).count());
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
    spdlog::debug("ns: {} child milestones (ms after clone):{}", spec.id, steps);
  }
  // Only the agent may hold the listening socket now: if it dies, connects fail at once
  // instead of waiting for the readiness timeout.
  listen_fd.Reset();
  log_fd.Reset();
  oom_fd.Reset();
  disk.Release();  // the sandbox's mount namespace holds it now; Destroy removes disk.img
  procs_fds.clear();
  work_fds.clear();
  v2_dir.Reset();

  auto ping = protocol::CallAgent(socket_path, Json{{"op", "ping"}}, kAgentReadyTimeoutMs);
  if (!ping.ok()) {
    std::string exited;
    // The socket closes while the agent is still exiting: give the exit a moment to complete
    // (failure path only) so the message can say how it ended.
    struct pollfd pfd{child.pidfd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
    siginfo_t info;
    std::memset(&info, 0, sizeof(info));
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(child.pidfd()), &info,
                 WEXITED | WNOHANG) == 0 && info.si_pid != 0) {
      exited = info.si_code == CLD_EXITED
                   ? fmt::format("agent exited during start-up with status {}; ", info.si_status)
                   : fmt::format("agent was killed by signal {} during start-up; ", info.si_status);
    }
    std::string tail = LogTail(log_path);
    return absl::Status(ping.status().code(),
                        fmt::format("wait for agent: {}ping on {}: {}{}", exited, socket_path,
                                    std::string(ping.status().message()),
                                    tail.empty() ? "" : fmt::format(" (agent.log: {})", tail)));
  }
  const auto t_ready = Clock::now();

  auto start_time = ProcessStartTime(child.pid());
  if (!start_time.ok()) return Annotate(start_time.status(), "create: read agent start time");

  pid_t pid = child.pid();
  UniqueFd pidfd = child.Release();
  dir_owner.Release();
  uint32_t uid_base = 0;
  if (uid_claim) {
    uid_base = uid_claim->base();
    uid_claim->Release();
  }
  auto inst = std::make_unique<NsInstance>(shared_, spec.id, pid, *start_time, std::move(pidfd),
                                           std::move(cgroup), uid_base);
  spdlog::debug(
      "ns: created {} (pid {}) in {:.2f} ms: dir {:.2f} (mkdir {:.2f}, disk {:.2f}, userns {:.2f}, chown {:.2f}), "
      "cgroups {:.2f}, prepare {:.2f}, clone..exec {:.2f}, agent ready {:.2f}",
      spec.id, pid, MsSince(t0), std::chrono::duration<double, std::milli>(t_dir - t0).count(),
      std::chrono::duration<double, std::milli>(t_mkdir - t0).count(),
      std::chrono::duration<double, std::milli>(t_disk - t_mkdir).count(),
      std::chrono::duration<double, std::milli>(t_take - t_disk).count(),
      std::chrono::duration<double, std::milli>(t_userns - t_take).count(),
      std::chrono::duration<double, std::milli>(t_cg - t_dir).count(),
      std::chrono::duration<double, std::milli>(t_prep - t_cg).count(),
      std::chrono::duration<double, std::milli>(t_exec - t_prep).count(),
      std::chrono::duration<double, std::milli>(t_ready - t_exec).count());
  return InstancePtr(std::move(inst));
}

absl::StatusOr<InstancePtr> NsBackend::Adopt(const std::string& id, const Json& persisted) {
  SBX_RETURN_IF_ERROR(shared_->Ready());
  if (!IsValidId(id, kIdPrefix)) {
    return absl::InvalidArgumentError(fmt::format("adopt: invalid sandbox id \"{}\"", id));
  }
  if (!persisted.is_object()) return absl::InvalidArgumentError("adopt: persisted state is not an object");
  auto pid_it = persisted.find("pid");
  auto st_it = persisted.find("start_time");
  if (pid_it == persisted.end() || !pid_it->is_number_integer() || st_it == persisted.end() ||
      !st_it->is_number_integer() || st_it->get<int64_t>() < 0) {
    return absl::InvalidArgumentError(
        fmt::format("adopt {}: persisted state lacks pid/start_time", id));
  }
  const int64_t pid64 = pid_it->get<int64_t>();
  if (pid64 <= 1 || pid64 > INT_MAX) {
    return absl::InvalidArgumentError(fmt::format("adopt {}: bad pid {}", id, pid64));
  }
  const pid_t pid = static_cast<pid_t>(pid64);
  const uint64_t start_time = st_it->get<uint64_t>();

  auto pidfd = OpenVerifiedPidfd(pid, start_time);
  if (!pidfd.ok()) {
    return absl::Status(pidfd.status().code(),
                        fmt::format("adopt {}: {}", id, std::string(pidfd.status().message())));
  }
  // The cgroup paths recorded at creation win over today's layout (sbxd may have moved, e.g.
  // into its v2 leaf, or runtime.ns.cgroup_parent changed); they must still name this sandbox:
  // the last component is its id (unique per host), so no other cgroup can be meant.
  std::unique_ptr<SandboxCgroup> cgroup;
  auto cg_it = persisted.find("cgroups");
  if (cg_it != persisted.end() && cg_it->is_object() && !cg_it->empty()) {
    std::vector<SandboxCgroup::Dir> dirs;
    auto names_this_sandbox = [&](const std::string& path) {
      const std::string tail = "/" + id;
      return !path.empty() && path[0] == '/' && path.find("/../") == std::string::npos &&
             path.size() > tail.size() + 1 &&
             path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (const auto& [key, val] : cg_it->items()) {
      if (!val.is_string()) return absl::InvalidArgumentError(fmt::format("adopt {}: bad cgroup path", id));
      std::string path = val.get<std::string>();
      if (!names_this_sandbox(path)) {
        return absl::InvalidArgumentError(
            fmt::format("adopt {}: persisted cgroup path {} does not name this sandbox", id, path));
      }
      dirs.push_back(SandboxCgroup::Dir{key, path, key == kUnifiedKey, true});
    }
    cgroup = std::make_unique<SandboxCgroup>(id, std::move(dirs));
    cgroup->Release();  // a failed adopt must not kill what it could not adopt
  } else {
    cgroup = shared_->cgroups->Existing(id);
  }

  // A paused sandbox's agent cannot answer: the verified pidfd is proof enough that it lives,
  // and it must stay frozen (waking it is the client's call, not the restart's).
  auto frozen = cgroup->FreezeRequested();
  if (!frozen.ok() || !*frozen) {
    const std::string socket_path = fmt::format("{}/{}", shared_->DirOf(id), kSocketName);
    auto ping = protocol::CallAgent(socket_path, Json{{"op", "ping"}}, kAdoptPingTimeoutMs);
    if (!ping.ok()) {
      return absl::NotFoundError(fmt::format("adopt {}: agent does not answer on {}: {}", id,
                                             socket_path, std::string(ping.status().message())));
    }
  }
  // The uid range stays this sandbox's: claim it again (a sweep by another sbxd may have
  // dropped the claim while we were down; the range is still in use by these processes).
  uint32_t uid_base = 0;
  auto ub_it = persisted.find("uid_base");
  if (ub_it != persisted.end() && ub_it->is_number_unsigned()) {
    uid_base = ub_it->get<uint32_t>();
  } else if (auto read = ReadUidBase(pid); read.ok() && *read != 0) {
    uid_base = *read;
  }
  if (uid_base != 0) {
    absl::Status claim = shared_->uid_ranges.Reclaim(uid_base, shared_->DirOf(id));
    if (!claim.ok()) spdlog::error("ns: adopt {}: {}", id, std::string(claim.message()));
  }
  return InstancePtr(std::make_unique<NsInstance>(shared_, id, pid, start_time,
                                                  std::move(*pidfd), std::move(cgroup), uid_base));
}

absl::Status NsBackend::Remove(const std::string& id) {
  SBX_RETURN_IF_ERROR(shared_->cgroup_status);
  if (!IsValidId(id, kIdPrefix)) {
    return absl::InvalidArgumentError(fmt::format("remove: invalid sandbox id \"{}\"", id));
  }
  return RemoveById(id);
}

absl::Status NsBackend::RemoveById(const std::string& id) {
  const Shared& s = *shared_;
  std::unique_ptr<SandboxCgroup> cg = s.cgroups->Existing(id);
  // pidfds first: a killed agent that is our child (created by this process, then forgotten)
  // must be reaped, or it stays a zombie.
  std::vector<UniqueFd> pidfds;
  for (pid_t p : cg->Pids()) {
    UniqueFd fd(PidfdOpen(p));
    if (fd) pidfds.push_back(std::move(fd));
  }
  for (const auto& fd : pidfds) PidfdSendSignal(fd.get(), SIGKILL);
  SBX_RETURN_IF_ERROR(cg->Kill());
  for (const auto& fd : pidfds) {
    if (!WaitPidfdExit(fd.get(), static_cast<int>(kCgroupDrainTimeout.count()))) {
      return absl::DeadlineExceededError(
          fmt::format("remove {}: a process is still alive {} ms after SIGKILL", id,
                      kCgroupDrainTimeout.count()));
    }
  }
  SBX_RETURN_IF_ERROR(cg->Destroy());
  SBX_RETURN_IF_ERROR(s.uid_ranges.ReleaseOwner(s.DirOf(id)));
  return RemoveTree(s.DirOf(id));
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

absl::Status NsBackend::Sweep(const std::set<std::string>& known_ids) {
  SBX_RETURN_IF_ERROR(shared_->cgroup_status);
  const Shared& s = *shared_;
  std::set<std::string> stray;
  auto collect = [&](const std::string& parent) -> absl::Status {
    auto names = ListDir(parent);
    if (!names.ok()) return absl::IsNotFound(names.status()) ? absl::OkStatus() : names.status();
    for (const auto& n : *names) {
      if (IsValidId(n, kIdPrefix) && known_ids.count(n) == 0) stray.insert(n);
    }
    return absl::OkStatus();
  };
  // Only ids with a directory under this sbxd's state dir are ours: several sbxd instances
  // (a test daemon beside the quickstart one) may share the `sbx` cgroup parents, and each must
  // sweep only its own leftovers. Create makes the directory before any cgroup and Destroy
  // removes the cgroups before the directory, so no cgroup of ours is ever without one.
  SBX_RETURN_IF_ERROR(Annotate(collect(s.sandboxes_dir), "sweep"));

  absl::Status result = absl::OkStatus();
  for (const std::string& id : stray) {
    spdlog::info("ns: sweeping unknown sandbox {}", id);
    absl::Status st = RemoveById(id);
    if (!st.ok()) {
      spdlog::error("ns: sweep of {} failed: {}", id, std::string(st.message()));
      if (result.ok()) result = Annotate(st, fmt::format("sweep {}", id));
    }
  }
  // After the strays are gone: a range is free only once no process of its sandbox is left.
  if (s.opts.user_namespaces) {
    absl::Status st = s.uid_ranges.Sweep(s.sandboxes_dir, known_ids);
    if (!st.ok() && result.ok()) result = Annotate(st, "sweep");
  }
  return result;
}

}  // namespace sbx::runtime::ns
