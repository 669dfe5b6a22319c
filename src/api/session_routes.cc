// /v1/sandboxes/{id}/sessions and /v1/sessions/{id}[/...]. The data plane (attach, stdin,
// signal, resize, ws) is api.cc's Attach, session_io.cc and session_ws.cc.
#include <nlohmann/json.hpp>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "common/log.h"
#include "service/agent_client.h"
#include "service/views.h"

namespace sbx::api {

namespace bhttp = http::bhttp;
using nlohmann::json;

Awaitable Routes::CreateSession(Api& api, Call& call) {
  auto body = ParseCreateSession(call.ctx.req.body());
  if (!body.ok()) co_return Fail(call.ctx, body.status());
  auto idem = IdempotencyFor(call.ctx.req, "/v1/sandboxes/" + call.id + "/sessions");
  if (!idem.ok()) co_return Fail(call.ctx, idem.status());
  auto r = log::With(call.ctx.log, [&] {
    return api.svc_.CreateSession(call.caller, call.id, *body, *idem);
  });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderAnswer(*r);
}

Awaitable Routes::GetSession(Api& api, Call& call) {
  http::RequestContext& ctx = call.ctx;
  const std::string& id = call.id;
  auto s = api.svc_.GetSession(call.caller, id);
  if (!s.ok()) co_return Fail(ctx, s.status());
  ctx.log.sandbox = s->sandbox_id;
  if (s->state != "exited") {
    // The agent knows whether the process is still running; the store may lag behind it when
    // no client was attached at exit.
    if (auto agent = api.svc_.AgentFor(s->sandbox_id)) {
      auto status = co_await agent->Status(ctx.executor, id);
      if (status.ok()) {
        log::With(ctx.log, [&] { api.svc_.RecordSessionStatus(id, *status); });
        auto again = api.svc_.GetSession(call.caller, id);
        if (again.ok()) s = std::move(again);
      }
    }
  }
  co_return RenderJson(bhttp::status::ok, service::SessionView(*s));
}

Awaitable Routes::Attach(Api& api, Call& call) {
  co_return co_await api.Attach(call.ctx, call.caller, call.id, call.target);
}

Awaitable Routes::SessionIo(Api& api, Call& call) {
  co_return co_await api.SessionIo(call.ctx, call.caller, call.id, call.action);
}

Awaitable Routes::WebSocket(Api& api, Call& call) {
  co_return co_await api.WebSocket(call.ctx, call.caller, call.id);
}

}  // namespace sbx::api
