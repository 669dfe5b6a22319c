// /v1/egress-profiles and /v1/sandboxes/{id}/egress (issue 16): what a sandbox may reach.
#include <nlohmann/json.hpp>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "common/log.h"

namespace sbx::api {

namespace bhttp = http::bhttp;

Awaitable Routes::EgressProfiles(Api& api, Call& call) {
  auto profiles = log::With(call.ctx.log, [&] { return api.svc_.EgressProfiles(call.caller); });
  if (!profiles.ok()) co_return Fail(call.ctx, profiles.status());
  co_return RenderJson(bhttp::status::ok, *profiles);
}

Awaitable Routes::SandboxEgress(Api& api, Call& call) {
  auto r = log::With(call.ctx.log, [&] { return api.svc_.SandboxEgress(call.caller, call.id); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(bhttp::status::ok, *r);
}

// PATCH /v1/sandboxes/{id}/egress: new allow rules for a running sandbox (docs/api.md).
Awaitable Routes::PatchSandboxEgress(Api& api, Call& call) {
  auto body = ParseEgressPatch(call.ctx.req.body());
  if (!body.ok()) co_return Fail(call.ctx, body.status());
  auto r = log::With(call.ctx.log,
                     [&] { return api.svc_.PatchSandboxEgress(call.caller, call.id, *body); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(bhttp::status::ok, *r);
}

}  // namespace sbx::api
