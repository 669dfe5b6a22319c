// What envd's process service keeps between calls (envd_process.cc): empty until it needs
// something (the pid → session mapping is read from the sandbox's agent).
#pragma once

namespace sbx::api::e2b {

struct ProcessTable {};

}  // namespace sbx::api::e2b
