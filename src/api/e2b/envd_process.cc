// envd's process.Process service (e2b-compat.md §8) over sbx sessions.
#include <fmt/format.h>

#include "api/e2b/connect.h"
#include "api/e2b/e2b.h"
#include "common/status_util.h"

namespace sbx::api::e2b {

Awaitable ProcessRpc(EnvdCall& call, std::string_view method) {
  co_return UnaryError(call.ctx.req,
                       RpcError{Code::kUnimplemented,
                                fmt::format("process.Process/{} is not served yet", method)});
}

}  // namespace sbx::api::e2b
