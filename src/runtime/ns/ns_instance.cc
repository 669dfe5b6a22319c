#include "runtime/ns/ns_instance.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <sys/statfs.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "net/nft_ruleset.h"
#include "net/sandbox_net.h"
#include "protocol/protocol.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/launcher.h"
#include "runtime/ns/net_counters.h"
#include "runtime/ns/ns_network.h"
#include "runtime/ns/pidfd.h"
#include "runtime/ns/port_dial.h"
#include "archive/upper_layer.h"

namespace sbx::runtime::ns {

namespace {

class NsInstance : public Instance {
 public:
  NsInstance(std::shared_ptr<NsBackend::Shared> shared, std::string id, pid_t pid,
             uint64_t start_time, UniqueFd pidfd, std::unique_ptr<SandboxCgroup> cgroup,
             uint32_t uid_base, std::unique_ptr<net::SandboxNetwork> network, UniqueFd upper)
      : shared_(std::move(shared)),
        id_(std::move(id)),
        dir_(shared_->DirOf(id_)),
        socket_(fmt::format("{}/{}", dir_, kSocketName)),
        pid_(pid),
        start_time_(start_time),
        pidfd_(std::move(pidfd)),
        cgroup_(std::move(cgroup)),
        uid_base_(uid_base),
        network_(std::move(network)),
        upper_(std::move(upper)) {
    cgroup_->Release();  // the sandbox outlives this object (and sbxd); Destroy() is explicit
  }
  ~NsInstance() override {
    // Likewise its network: a restart adopts it (ns_adopt.cc), only Destroy() removes it.
    if (network_ && !destroyed_) network_->Release();
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
                {"uid_base", uid_base_},
                {"networked", network_ != nullptr},
                {"egress", NetworkPolicyJson(network_.get())}};
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
    if (cgroup_) {
      const std::string file = cgroup_->AgentOomCounterPath();
      auto text = file.empty() ? absl::StatusOr<std::string>(absl::NotFoundError("")) : ReadFileToString(file);
      const size_t at = text.ok() ? text->find("oom_kill ") : std::string::npos;
      if (at != std::string::npos && std::strtoull(text->c_str() + at + 9, nullptr, 10) > 0) {
        how += "; the OOM killer took it: its memory limit (runtime.ns.agent_memory_mib) was reached";
      }
    }
    return how;
  }

  absl::StatusOr<std::map<std::string, uint64_t>> DeniedEgress() const override {
    if (network_) {
      // The host's nftables counters plus what sbxd's resolver and proxy refused, as
      // GET /v1/sandboxes/{id}/egress adds them (the namespace's own no-route count is for
      // `none` sandboxes, which have no route at all).
      net::NetworkHost* host = shared_->opts.network;
      auto counts = host->Denials(id_);
      if (!counts.ok()) return counts.status();
      for (const auto& [reason, n] : host->denials_log().Counts(id_)) (*counts)[reason] += n;
      return *counts;
    }
    if (!Alive()) {
      return absl::FailedPreconditionError(fmt::format("denied egress {}: agent not alive", id_));
    }
    auto n = ReadNoRouteCount(pid_);
    if (!n.ok()) return n.status();
    // The pid names our agent only while it exists: alive after the read, it was the agent's.
    if (!Alive()) {
      return absl::FailedPreconditionError(fmt::format("denied egress {}: agent exited", id_));
    }
    return std::map<std::string, uint64_t>{{net::kReasonNoRoute, *n}};
  }

  absl::Status AttachEgress(const Json& egress) override {
    if (destroyed_ || !network_ || !network_->id().empty()) {
      return absl::FailedPreconditionError(fmt::format(
          "attach egress {}: not a network-ready sandbox with an unclaimed network", id_));
    }
    return ClaimNetwork(shared_->opts.network, id_, egress, *network_);
  }

  absl::StatusOr<UniqueFd> DialPort(uint16_t port, bool ipv6) const override {
    // The agent's pidfd names its namespace without a pid that could be recycled.
    if (destroyed_ || !pidfd_) {
      return absl::FailedPreconditionError(fmt::format("dial port {}: no agent", id_));
    }
    return DialLoopback(pidfd_.get(), port, ipv6);
  }

  absl::StatusOr<ExportedLayer> ExportWritableLayer(
      int out_fd, const std::function<bool()>& cancelled, uint64_t max_entries) override {
    if (destroyed_ || !upper_) {
      return absl::FailedPreconditionError(fmt::format(
          "export writable layer {}: not a build sandbox (keep_writable_layer)", id_));
    }
    // Frozen, nothing the step left running can change a file while it is read.
    SBX_RETURN_IF_ERROR(Annotate(Freeze(), fmt::format("export writable layer {}", id_)));
    auto layer = archive::WriteUpperAsLayerFile(upper_.get(), uid_base_, kUidRangeSize, out_fd,
                                                cancelled, max_entries);
    // Thawed again: a v1 freezer holds even SIGKILL until then, and Destroy comes next.
    absl::Status thaw = Thaw();
    if (!layer.ok()) return Annotate(layer.status(), fmt::format("export writable layer {}", id_));
    SBX_RETURN_IF_ERROR(Annotate(thaw, fmt::format("export writable layer {}", id_)));
    return ExportedLayer{layer->diff_id, layer->tar_bytes, layer->entries};
  }

  absl::Status Destroy() override {
    if (destroyed_) return absl::OkStatus();
    const auto t0 = Clock::now();
    upper_.Reset();  // it would keep the disk's ext4 mounted after the namespace is gone
    // 0. With a reaper: a reference to the sandbox's root (its overlay, which holds the disk),
    //    taken while the agent is alive. The mount namespace then dies with the last process as
    //    before, but the overlay and the disk's ext4 stay mounted, detached from every
    //    namespace, until the reaper closes this fd: their unmount (an ext4 shutdown on the
    //    loop device, 40-65 ms measured here) runs on the reaper's thread, not in the dying
    //    agent's exit that Destroy waits for.
    UniqueFd root = HoldRoot();
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
    // 3b. The network (veth, addresses, nftables elements, address slot), once no process of
    //     the sandbox is left to use it.
    if (network_) {
      SBX_RETURN_IF_ERROR(Annotate(network_->Destroy(), fmt::format("destroy {}: network", id_)));
      network_.reset();
    }
    // 4-5. Wait for the cgroups to empty, remove them.
    SBX_RETURN_IF_ERROR(Annotate(cgroup_->Destroy(), fmt::format("destroy {}", id_)));
    const auto t_cgroups = Clock::now();
    // 6. The uid range: free for another sandbox now that no process of this one is left.
    if (uid_base_ != 0) {
      SBX_RETURN_IF_ERROR(Annotate(shared_->uid_ranges.Release(uid_base_, dir_), fmt::format("destroy {}", id_)));
    }
    // 7. The sandbox's files (disk image, upper layer, socket, log). The mounts lived only in
    //    the sandbox's mount namespace, which died with its last process: nothing of the
    //    sandbox runs or can be reached now, so the reaper may remove them after the delete
    //    (reaper.h); inline when there is none or its backlog is full.
    const bool deferred = shared_->reaper && shared_->reaper->Defer(dir_, std::move(root));
    if (!deferred) {
      root.Reset();
      SBX_RETURN_IF_ERROR(Annotate(RemoveTree(dir_), fmt::format("destroy {}", id_)));
    }
    destroyed_ = true;
    spdlog::debug("ns: destroyed {} in {:.2f} ms: kill+reap {:.2f}, cgroups {:.2f}, files {:.2f}{}",
                  id_, MsSince(t0), std::chrono::duration<double, std::milli>(t_reaped - t0).count(),
                  std::chrono::duration<double, std::milli>(t_cgroups - t_reaped).count(),
                  MsSince(t_cgroups), deferred ? " (queued for the reaper)" : "");
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
  // O_PATH fd of the agent's root (the sandbox's overlay), or none: without a reaper, or when
  // the agent is gone (then the pid may name another process: nothing is taken).
  UniqueFd HoldRoot() const {
    if (!shared_->reaper || !Alive()) return UniqueFd();
    UniqueFd fd(::open(fmt::format("/proc/{}/root", pid_).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    struct statfs sfs;
    // Alive again after the open: the pid was still the agent's when it was opened. Anything but
    // an overlay is not the sandbox's root: not held.
    if (!fd || !Alive() || ::fstatfs(fd.get(), &sfs) != 0 || sfs.f_type != OVERLAYFS_SUPER_MAGIC) {
      return UniqueFd();
    }
    return fd;
  }

  std::shared_ptr<NsBackend::Shared> shared_;
  std::string id_;
  std::string dir_;
  std::string socket_;
  pid_t pid_;
  uint64_t start_time_;
  UniqueFd pidfd_;
  std::unique_ptr<SandboxCgroup> cgroup_;
  uint32_t uid_base_;  // 0 without a user namespace
  std::unique_ptr<net::SandboxNetwork> network_;  // networked sandboxes only
  UniqueFd upper_;  // build sandboxes only: the disk's upper directory (ExportWritableLayer)
  bool destroyed_ = false;
};

}  // namespace

InstancePtr MakeNsInstance(std::shared_ptr<NsBackend::Shared> shared, std::string id, pid_t pid,
                           uint64_t start_time, UniqueFd pidfd,
                           std::unique_ptr<SandboxCgroup> cgroup, uint32_t uid_base,
                           std::unique_ptr<net::SandboxNetwork> network, UniqueFd upper) {
  return std::make_unique<NsInstance>(std::move(shared), std::move(id), pid, start_time,
                                      std::move(pidfd), std::move(cgroup), uid_base,
                                      std::move(network), std::move(upper));
}

}  // namespace sbx::runtime::ns
