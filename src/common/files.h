// Reading and writing whole files without exceptions, through close-on-exec descriptors. std::ifstream read through istreambuf_iterator
// throws std::ios_base::failure when read(2) fails (libstdc++'s filebuf::underflow), as
// reading /proc/<pid>/... does with ESRCH once the process is gone: in sbxd that escaped an
// operation's job. tools/check_house.py keeps istreambuf_iterator out of src/.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx {

// The whole file; the error names the path, the syscall and errno.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// The whole file, or "" when it cannot be opened or read (for optional files).
std::string ReadFileOrEmpty(const std::string& path);
// Creates or truncates `path` (with `mode` when created) and writes all of `contents`. Unlike
// std::ofstream the descriptor is close-on-exec, so a program another thread starts meanwhile
// does not inherit it (tools/check_house.py), and the error names the path, syscall and errno.
absl::Status WriteFileContents(const std::string& path, std::string_view contents,
                               mode_t mode = 0644);

}  // namespace sbx
