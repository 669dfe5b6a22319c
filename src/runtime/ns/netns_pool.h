// NetnsPool: network namespaces built ahead of launches, each with `lo` up.
//
// A new network namespace is the most expensive namespace to create (0.6 ms idle on these VMs,
// several ms when it queues behind the kernel's asynchronous cleanup of namespaces that
// sandboxes just left, which holds rtnl). A thread at idle CPU priority keeps a few ready, held
// by fd only; a launch takes one and its child joins it with setns. With the pool empty, the
// launch falls back to CLONE_NEWNET. The namespaces belong to no sandbox until taken and vanish
// with sbxd's fds if it dies, so there is nothing to sweep.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "runtime/ns/ready_pool.h"

namespace sbx::runtime::ns {

// Builds one network namespace with `lo` up on the calling thread and returns to the thread's
// original one. Returns an fd of the new namespace.
absl::StatusOr<UniqueFd> BuildNetns();

class NetnsPool {
 public:
  explicit NetnsPool(int size);
  ~NetnsPool();  // stops the filler; the pooled namespaces go with their fds

  void Start();
  // A ready namespace, or an empty fd when the pool is empty (or has size 0).
  UniqueFd Take();
  int ready() const;

 private:
  ReadyPool<UniqueFd> pool_;
};

}  // namespace sbx::runtime::ns
