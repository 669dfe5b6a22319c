// What this binary was built from, for sbx_build_info and version output.
#pragma once

#include <string_view>

namespace sbx {

// The CMake project version, e.g. "0.1.0".
std::string_view BuildVersion();
// `git rev-parse --short HEAD` when CMake configured the build tree; "unknown" outside a git
// checkout. A commit made after configuring shows only after the next configure.
std::string_view BuildCommit();

}  // namespace sbx
