// envd's REST file routes, GET and POST /files (e2b-compat.md §6).
#include "api/e2b/e2b.h"
#include "api/e2b/errors.h"
#include "common/status_util.h"

namespace sbx::api::e2b {

Awaitable FilesRest(EnvdCall& call) {
  co_return RestError(call.ctx,
                      ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                               "/files is not served yet"),
                      Side::kEnvd);
}

}  // namespace sbx::api::e2b
