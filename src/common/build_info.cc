#include "common/build_info.h"

// Defined for this file's library only (src/common/CMakeLists.txt).
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
