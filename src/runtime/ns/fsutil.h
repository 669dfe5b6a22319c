// Small file-system helpers of the ns runtime (parent side only: they allocate).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/files.h"

namespace sbx::runtime::ns {

using ::sbx::ReadFileToString;
// open(O_WRONLY|O_TRUNC [|O_CREAT]) + one write. Cgroup control files take one value per write.
absl::Status WriteStringToFile(const std::string& path, const std::string& value,
                               bool create = false);

// mkdir -p with `mode` for the missing components; an existing directory is fine.
absl::Status MkdirAll(const std::string& path, mode_t mode);

// An empty directory with `mode` at `path` (made if missing): FailedPrecondition when `path`
// is a symlink, not a directory, or holds anything. Read-only views of every sandbox use one
// as their second lower layer, so whatever it held would appear in them.
absl::Status MakeEmptyDir(const std::string& path, mode_t mode);

// Removes `path` and everything below it without following symlinks or crossing into another
// file system. Works as root on directories with mode 000 (overlayfs makes work/work so), and
// as a non-root owner too (it chmods such directories first). Iterative, so a hostile depth
// cannot exhaust the stack, and it keeps a bounded number of directories open. ENOENT on
// `path` itself is success.
absl::Status RemoveTree(const std::string& path);

// Names of the entries of a directory (without "." and ".."); NotFound when it does not exist.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot): with the pid it names a
// process uniquely, so a recycled pid is never mistaken for our agent. NotFound when gone.
absl::StatusOr<uint64_t> ProcessStartTime(pid_t pid, const std::string& proc_root = "/proc");

// Pids listed one per line (cgroup.procs).
std::vector<pid_t> ParsePidList(const std::string& text);

}  // namespace sbx::runtime::ns
