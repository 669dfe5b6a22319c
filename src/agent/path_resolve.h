// Moved to common/path_resolve.h (the CLI's extraction of a downloaded tar needs it too, and
// the CLI links no agent code). Kept so that agent files written before the move still build;
// include common/path_resolve.h in new code.
#pragma once

#include "common/path_resolve.h"
