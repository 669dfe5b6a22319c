// GET /v1/runtimes: which runtimes a create may ask for on this host (docs/api.md).
#include "api/render.h"
#include "api/routes.h"

namespace sbx::api {

namespace bhttp = http::bhttp;

Awaitable Routes::Runtimes(Api& api, Call& call) {
  co_return RenderJson(bhttp::status::ok, api.svc_.Runtimes());
}

}  // namespace sbx::api
