// A running sandbox of the ns runtime (the Instance that Create and Adopt return): its agent's
// pidfd and cgroups, Destroy (docs/isolation.md §6.1), pause and wake (§2.4).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "net/sandbox_net.h"
#include "runtime/ns/ns_shared.h"

namespace sbx::runtime::ns {

// The sandbox outlives the returned object (and sbxd): its cgroups are released from `cgroup`,
// and only Destroy() removes it.
InstancePtr MakeNsInstance(std::shared_ptr<NsBackend::Shared> shared, std::string id, pid_t pid,
                           uint64_t start_time, UniqueFd pidfd,
                           std::unique_ptr<SandboxCgroup> cgroup, uint32_t uid_base,
                           std::unique_ptr<net::SandboxNetwork> network = nullptr,
                           UniqueFd upper = UniqueFd());

}  // namespace sbx::runtime::ns
