// What of the host a microVM may see through its read-only 9p shares.
//
// A template's binds show host directories (the base template: host /usr and /etc) and mask
// what must stay hidden with an empty file or directory bound over it (/etc/shadow, ssh host
// keys). In the ns runtime those masks hold: sandbox root cannot unmount them. A guest's root
// can unmount anything in its own kernel, so a 9p share of host /etc would give it the host's
// /etc/shadow. Hence a directory with masks below it is never shared itself: the guest gets a
// copy of it in which every masked path is an empty file or directory, under
// <state>/microvm-assets/views/.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend.h"

namespace sbx::runtime::microvm {

struct GuestShare {
  std::string host_path;     // a directory
  std::string sandbox_path;  // where the guest mounts it (read-only)
};

// The shares for a template's binds: binds nested in another bind fold into a masked copy of
// it (under `views_dir`, named by the tree's names, kinds, modes, owners, sizes and mtimes, so
// a change on the host makes a new copy and never rewrites one a VM shares); the rest are
// shared as they are. A
// bind of a single file that is not nested in another is InvalidArgument (9p shares
// directories).
absl::StatusOr<std::vector<GuestShare>> SharesForBinds(const std::vector<BindMount>& binds,
                                                       const std::string& views_dir);

// Copies the tree at `src` to `dst` (which must not exist): directories, regular files and
// symlinks with their modes and owners; other kinds are left out. Each relative path in
// `masks` is made an empty file (or directory, when its value is true) instead.
absl::Status CopyMasked(const std::string& src, const std::string& dst,
                        const std::vector<std::pair<std::string, bool>>& masks);

}  // namespace sbx::runtime::microvm
