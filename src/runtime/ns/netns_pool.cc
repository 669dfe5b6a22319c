#include "runtime/ns/netns_pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "runtime/ns/netns.h"

namespace sbx::runtime::ns {

absl::StatusOr<UniqueFd> BuildNetns() {
  UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!original) return ErrnoStatus(errno, "netns pool: open(/proc/thread-self/ns/net)");
  // Only this thread moves: a thread may unshare its network namespace on its own.
  if (::unshare(CLONE_NEWNET) != 0) return ErrnoStatus(errno, "netns pool: unshare(CLONE_NEWNET)");
  absl::Status st = absl::OkStatus();
  UniqueFd fresh(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!fresh) {
    st = ErrnoStatus(errno, "netns pool: open(/proc/thread-self/ns/net) of the new namespace");
  } else if (int stage = 0, err = PrepareSandboxNetns(&stage); err != 0) {
    st = ErrnoStatus(err, stage == 0 ? "netns pool: ioctl(lo, SIOCSIFFLAGS, IFF_UP)"
                                     : "netns pool: write(net.ipv4.ip_unprivileged_port_start, 0)");
  }
  if (::setns(original.get(), CLONE_NEWNET) != 0) {
    // This thread would stay in a sandbox's namespace: nothing it does later may rely on that.
    return ErrnoStatus(errno, "netns pool: setns back to the host network namespace");
  }
  if (!st.ok()) return st;
  return fresh;
}

absl::StatusOr<PooledNetns> BuildNetworkedNetns(net::NetworkHost* host) {
  PooledNetns out;
  SBX_ASSIGN_OR_RETURN(out.netns, BuildNetns());
  SBX_ASSIGN_OR_RETURN(out.network, host->Prebuild(out.netns.get()));
  return out;
}

namespace {

// Logs a build failure; false (stop for good) when the building thread may be stuck in a
// sandbox's namespace.
bool OnBuildError(const absl::Status& st) {
  spdlog::warn("{} (launches create their own network namespace meanwhile)", std::string(st.message()));
  if (st.message().find("setns back") != std::string::npos) {
    // Never build again from a thread stuck in the wrong namespace.
    spdlog::error("netns pool: stopped");
    return false;
  }
  return true;
}

}  // namespace

NetnsPool::NetnsPool(int size, net::NetworkHost* network) : pool_(size, BuildNetns, OnBuildError) {
  if (network != nullptr && size > 0) {
    networked_ = std::make_unique<ReadyPool<PooledNetns>>(
        size, [network] { return BuildNetworkedNetns(network); },
        [](const absl::Status& st) { return OnBuildError(Annotate(st, "netns pool (networked)")); });
  }
}

NetnsPool::~NetnsPool() = default;

void NetnsPool::Start() { pool_.Start(); }

UniqueFd NetnsPool::Take() {
  std::optional<UniqueFd> fd = pool_.Take();
  return fd ? std::move(*fd) : UniqueFd();
}

std::optional<PooledNetns> NetnsPool::TakeNetworked() {
  if (!networked_) return std::nullopt;
  std::call_once(networked_started_, [this] { networked_->Start(); });
  return networked_->Take();
}

int NetnsPool::ready() const { return pool_.ready(); }

int NetnsPool::ready_networked() const { return networked_ ? networked_->ready() : 0; }

}  // namespace sbx::runtime::ns
