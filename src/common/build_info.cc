#include "common/build_info.h"

// Set for this file only (src/common/CMakeLists.txt), so a new commit recompiles one object.
#ifndef SBX_VERSION
#error "SBX_VERSION must be defined by the build"
#endif
#ifndef SBX_GIT_COMMIT
#error "SBX_GIT_COMMIT must be defined by the build"
#endif

namespace sbx {

std::string_view BuildVersion() { return SBX_VERSION; }
std::string_view BuildCommit() { return SBX_GIT_COMMIT; }

}  // namespace sbx
