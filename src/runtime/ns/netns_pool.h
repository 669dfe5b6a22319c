// NetnsPool: network namespaces built ahead of launches, each with `lo` up, and, when sbxd has
// networking on, a second kind with the sandbox's veth as well.
//
// A new network namespace is the most expensive namespace to create (0.6 ms idle on these VMs,
// several ms when it queues behind the kernel's asynchronous cleanup of namespaces that
// sandboxes just left, which holds rtnl). A thread at idle CPU priority keeps a few ready, held
// by fd only; a launch takes one and its child joins it with setns. With the pool empty, the
// launch falls back to CLONE_NEWNET. The loopback-only namespaces belong to no sandbox until
// taken and vanish with sbxd's fds if it dies, so there is nothing to sweep.
//
// The networked kind (issue 16's speed): the same namespace plus what a networked sandbox's
// network needs whatever its profile (NetworkHost::Prebuild: address slot, veth pair, addresses,
// routes, both ends operational). A networked create claims one (NetworkHost::Claim: its
// nftables elements and the veth's alias), so its create path does one nftables transaction
// and one netlink request instead of building the link and waiting for it. Until claimed the
// veth passes no traffic (no elements: dropped) and is named `pooled_<veth>` by its alias, so
// a sweep after a crash removes it. Its filler starts at the first networked create (after the
// start-up sweep and adoption, which must not race it for address slots), and it keeps as many
// as the loopback-only kind.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "net/sandbox_net.h"
#include "runtime/ns/ready_pool.h"

namespace sbx::runtime::ns {

// Builds one network namespace with `lo` up on the calling thread and returns to the thread's
// original one. Returns an fd of the new namespace.
absl::StatusOr<UniqueFd> BuildNetns();

// A namespace with a pooled, unclaimed network in it. The network is declared last so that it
// goes first (its veth removed while the namespace still exists).
struct PooledNetns {
  UniqueFd netns;
  std::unique_ptr<net::SandboxNetwork> network;
};

// BuildNetns plus NetworkHost::Prebuild in it.
absl::StatusOr<PooledNetns> BuildNetworkedNetns(net::NetworkHost* host);

class NetnsPool {
 public:
  // `network`: sbxd's NetworkHost (it outlives the pool), or null when networking is off (then
  // there is no networked kind).
  explicit NetnsPool(int size, net::NetworkHost* network = nullptr);
  ~NetnsPool();  // stops the fillers; the pooled namespaces go with their fds, veths removed

  void Start();
  // A ready namespace, or an empty fd when the pool is empty (or has size 0).
  UniqueFd Take();
  // A ready networked namespace, or nullopt (empty, size 0, or networking off). The first call
  // starts the networked filler.
  std::optional<PooledNetns> TakeNetworked();
  int ready() const;
  int ready_networked() const;

 private:
  ReadyPool<UniqueFd> pool_;
  std::unique_ptr<ReadyPool<PooledNetns>> networked_;
  std::once_flag networked_started_;
};

}  // namespace sbx::runtime::ns
