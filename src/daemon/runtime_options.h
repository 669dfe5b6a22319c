// What each runtime is built with, from sbxd's configuration (docs/config.md, [runtime.*]).
#pragma once

#include <string>

#include "daemon/config.h"
#include "runtime/microvm/microvm_backend.h"
#include "runtime/ns/ns_backend.h"

namespace sbx::daemon {

runtime::ns::NsOptions NsOptionsOf(const Config& c, const std::string& agent_path);
runtime::microvm::MicrovmOptions MicrovmOptionsOf(const Config& c, const std::string& agent_path);

}  // namespace sbx::daemon
