// Reading whole files without exceptions. std::ifstream read through istreambuf_iterator
// throws std::ios_base::failure when read(2) fails (libstdc++'s filebuf::underflow), as
// reading /proc/<pid>/... does with ESRCH once the process is gone: in sbxd that escaped an
// operation's job. tools/check_house.py keeps istreambuf_iterator out of src/.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace sbx {

// The whole file; the error names the path, the syscall and errno.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// The whole file, or "" when it cannot be opened or read (for optional files).
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace sbx
