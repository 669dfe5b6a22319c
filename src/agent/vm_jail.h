// The VMM's jail (`sbx-agent --vm-jail SPEC -- QEMU ARGV...`): the microvm runtime starts QEMU
// through it so that the process emulating a guest's devices holds only what that one VM needs
// (docs/isolation.md §8, "The VMM's jail", lists the steps in order):
//   1. join the VM's cgroups (writes its own pid to each cgroup.procs in the spec);
//   2. open the VM's tap (persistent, made by sbxd) as fd 4, while it still may;
//   3. new mount, network, IPC and UTS namespaces: no network at all (the tap's fd carries the
//      guest's packets, unix sockets are reached by path), no host IPC;
//   4. a tmpfs root holding only the spec's paths, each bound at its own path (read-only unless
//      the spec says writable; nosuid, nodev except the listed devices), the host's merged-/usr
//      links, then pivot_root and the old root detached;
//   5. RLIMIT_FSIZE (SIGXFSZ ignored) so no file it writes outgrows the sandbox's own sizes (the
//      guest's console log above all); the VM's own uid and gid (a range claimed host-wide, as the ns runtime's), supplementary
//      groups only as listed (kvm), no_new_privs, every capability gone with the uid change;
//   6. exec QEMU, which adds its own seccomp filter (-sandbox).
// Any failure exits 125 with the step and errno on stderr (qemu.log), before QEMU runs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "protocol/jail_spec.h"

namespace sbx::agent {

using protocol::JailBind;
using protocol::JailSpec;

// Never returns on success (QEMU runs); exits 125 on failure.
int RunVmJail(const std::string& spec_path, const std::vector<std::string>& argv);

// The bridge's confinement (`sbx-agent --vm-bridge ... --as-uid N`), once it holds every socket
// it will use and before it reads a byte the guest sent (the mux frames are the first guest
// data a host process parses): the VMM's cgroups (the `cgroup_procs` of the VM's jail spec at
// `jail_spec`, when there is one), new network and IPC namespaces, chroot into `empty_dir`
// (made here, root's, mode 0555), the VMM's uid and gid without supplementary groups, every
// capability gone with the uid change, no_new_privs, not dumpable (QEMU, which runs as the same
// uid, cannot ptrace it), RLIMIT_FSIZE at 16 MiB (its log). An error names the step and errno.
absl::Status ConfineBridge(uint32_t uid, const std::string& empty_dir, const std::string& jail_spec);

}  // namespace sbx::agent
