// /v1/sandboxes and what hangs off one sandbox.
#include <nlohmann/json.hpp>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "common/log.h"
#include "service/views.h"

namespace sbx::api {

namespace bhttp = http::bhttp;
using nlohmann::json;

Awaitable Routes::CreateSandbox(Api& api, Call& call) {
  auto body = ParseCreateSandbox(call.ctx.req.body(), api.limits());
  if (!body.ok()) co_return Fail(call.ctx, body.status());
  auto idem = IdempotencyFor(call.ctx.req, "/v1/sandboxes");
  if (!idem.ok()) co_return Fail(call.ctx, idem.status());
  auto r = log::With(call.ctx.log,
                     [&] { return api.svc_.CreateSandbox(call.caller, *body, *idem); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderAnswer(*r);
}

Awaitable Routes::ListSandboxes(Api& api, Call& call) {
  store::SandboxFilter f;
  auto limit = ParseLimit(call.target.Query("limit"));
  if (!limit.ok()) co_return Fail(call.ctx, limit.status());
  f.limit = *limit;
  f.state = call.target.Query("state");
  if (auto label = call.target.Query("label")) {
    auto l = ParseLabelFilter(*label);
    if (!l.ok()) co_return Fail(call.ctx, l.status());
    f.label = *l;
  }
  f.page_token = call.target.Query("page_token").value_or("");
  auto page = log::With(call.ctx.log, [&] { return api.svc_.ListSandboxes(call.caller, f); });
  if (!page.ok()) co_return Fail(call.ctx, page.status());
  json list = json::array();
  for (const auto& sb : page->items) list.push_back(service::SandboxView(sb));
  co_return RenderJson(bhttp::status::ok,
                       {{"sandboxes", list},
                        {"next_page_token", page->next_page_token
                                                ? json(*page->next_page_token)
                                                : json(nullptr)}});
}

Awaitable Routes::GetSandbox(Api& api, Call& call) {
  auto sb = log::With(call.ctx.log, [&] { return api.svc_.GetSandbox(call.caller, call.id); });
  if (!sb.ok()) co_return Fail(call.ctx, sb.status());
  nlohmann::json view = service::SandboxView(*sb);
  // Where its ports are reachable by host name ({port}-{id}.{domain}; null: path form only).
  view["ports_domain"] = api.opts_.ports_domain.empty() ? nlohmann::json(nullptr)
                                                        : nlohmann::json(api.opts_.ports_domain);
  co_return RenderJson(bhttp::status::ok, view);
}

Awaitable Routes::DeleteSandbox(Api& api, Call& call) {
  auto idem = IdempotencyFor(call.ctx.req, "/v1/sandboxes/" + call.id);
  if (!idem.ok()) co_return Fail(call.ctx, idem.status());
  auto r = log::With(call.ctx.log,
                     [&] { return api.svc_.DeleteSandbox(call.caller, call.id, *idem); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderAnswer(*r);
}

// POST /v1/sandboxes/{id}/{pause,suspend,wake}
Awaitable Routes::Lifecycle(Api& api, Call& call) {
  if (auto b = ParseLifecycleBody(call.ctx.req.body()); !b.ok()) co_return Fail(call.ctx, b);
  auto idem = IdempotencyFor(call.ctx.req, "/v1/sandboxes/" + call.id + "/" + call.action);
  if (!idem.ok()) co_return Fail(call.ctx, idem.status());
  auto r = log::With(call.ctx.log, [&] {
    return api.svc_.RequestLifecycle(call.caller, call.id, call.action, *idem);
  });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderAnswer(*r);
}

Awaitable Routes::Processes(Api& api, Call& call) {
  co_return co_await api.Processes(call.ctx, call.caller, call.id);
}

Awaitable Routes::Files(Api& api, Call& call) {
  co_return co_await api.Files(call.ctx, call.caller, call.id, call.action, call.target);
}

}  // namespace sbx::api
