// Adopt (docs/isolation.md §2.3), Remove and Sweep (§6.2): the ns backend's work on sandboxes
// it did not create in this run.
#include <signal.h>

#include <climits>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "protocol/protocol.h"
#include "runtime/ns/fsutil.h"
#include "runtime/ns/launcher.h"
#include "runtime/ns/ns_instance.h"
#include "runtime/ns/ns_network.h"
#include "runtime/ns/ns_shared.h"
#include "runtime/ns/pidfd.h"

namespace sbx::runtime::ns {

namespace {

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
  std::unique_ptr<net::SandboxNetwork> network;
  if (persisted.value("networked", false)) {
    auto egress = persisted.find("egress");
    network = AdoptNetwork(shared_->opts.network, id,
                           egress != persisted.end() ? *egress : nlohmann::json(nullptr));
  }
  return MakeNsInstance(shared_, id, pid, start_time, std::move(*pidfd), std::move(cgroup), uid_base,
                        std::move(network));
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
  if (auto network = AdoptNetwork(s.opts.network, id)) {
    SBX_RETURN_IF_ERROR(Annotate(network->Destroy(), fmt::format("remove {}: network", id)));
  }
  SBX_RETURN_IF_ERROR(s.uid_ranges.ReleaseOwner(s.DirOf(id)));
  return RemoveTree(s.DirOf(id));
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
  // Networks of sandboxes no sbxd knows (veths, elements, chains), strays' included.
  if (s.opts.network != nullptr) {
    absl::Status st = s.opts.network->Sweep(known_ids);
    if (!st.ok() && result.ok()) result = Annotate(st, "sweep: network");
  }
  // After the strays are gone: a range is free only once no process of its sandbox is left.
  if (s.opts.user_namespaces) {
    absl::Status st = s.uid_ranges.Sweep(s.sandboxes_dir, known_ids);
    if (!st.ok() && result.ok()) result = Annotate(st, "sweep");
  }
  return result;
}

}  // namespace sbx::runtime::ns
