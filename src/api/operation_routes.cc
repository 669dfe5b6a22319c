// /v1/operations/{id}, with its long poll (wait_ms).
#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "service/views.h"

namespace sbx::api {

namespace bhttp = http::bhttp;

Awaitable Routes::GetOperation(Api& api, Call& call) {
  auto wait_ms = ParseWaitMs(call.target.Query("wait_ms"));
  if (!wait_ms.ok()) co_return Fail(call.ctx, wait_ms.status());
  auto op = co_await api.WaitForOperation(call.ctx, call.caller, call.id,
                                          std::chrono::milliseconds(*wait_ms));
  if (!op.ok()) co_return Fail(call.ctx, op.status());
  co_return RenderJson(bhttp::status::ok, service::OperationView(*op));
}

}  // namespace sbx::api
