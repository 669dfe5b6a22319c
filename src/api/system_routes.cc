// The routes outside /v1: health probes and metrics.
#include <nlohmann/json.hpp>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/routes.h"
#include "common/status_util.h"

namespace sbx::api {

namespace bhttp = http::bhttp;

Awaitable Routes::Healthz(Api&, Call&) {
  co_return RenderJson(bhttp::status::ok, {{"status", "ok"}});
}

Awaitable Routes::Readyz(Api& api, Call& call) {
  if (!api.svc_.ready()) {
    co_return Fail(call.ctx, ApiError(absl::StatusCode::kUnavailable, "unavailable",
                                      "sbxd is reconciling its sandboxes"));
  }
  co_return RenderJson(bhttp::status::ok, {{"status", "ready"}});
}

Awaitable Routes::Metrics(Api& api, Call&) {
  http::Response res{bhttp::status::ok, 11};
  res.set(bhttp::field::content_type, metrics::kContentType);
  res.set(bhttp::field::cache_control, "no-store");
  res.body() = api.registry_.Expose();
  co_return res;
}

}  // namespace sbx::api
