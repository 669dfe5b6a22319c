// envd's filesystem.Filesystem service (e2b-compat.md §9) over the agent's file calls.
#include <fmt/format.h>

#include "api/e2b/connect.h"
#include "api/e2b/e2b.h"
#include "common/status_util.h"

namespace sbx::api::e2b {

Awaitable FilesystemRpc(EnvdCall& call, std::string_view method) {
  co_return UnaryError(call.ctx.req,
                       RpcError{Code::kUnimplemented,
                                fmt::format("filesystem.Filesystem/{} is not served yet", method)});
}

}  // namespace sbx::api::e2b
