// /v1/admin: tenants, their tokens and the audit log (docs/tenancy.md). The router has checked
// the admin scope and that tenancy is configured; the service decides what the caller's tenant
// may see (another tenant's tenant or token is 404).
#include <charconv>

#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "service/template_service.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;

Awaitable Answer(Call& call, const absl::StatusOr<nlohmann::json>& r,
                 bhttp::status ok = bhttp::status::ok) {
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(ok, *r);
}

// RFC 3339 in UTC with or without a fraction of a second (the store's own form has exactly
// milliseconds).
std::optional<std::chrono::system_clock::time_point> ParseSince(const std::string& s) {
  if (s.size() < 20 || s.size() > 40 || s.back() != 'Z') return std::nullopt;
  std::string ms = "000";
  if (s.size() > 20) {
    if (s[19] != '.' || s.size() < 22) return std::nullopt;
    const std::string frac = s.substr(20, s.size() - 21);
    if (frac.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    ms = (frac + "00").substr(0, 3);
  }
  return ParseRfc3339(s.substr(0, 19) + "." + ms + "Z");
}

// The attach keys are the deployment's: the operator's admin only.
absl::Status NeedOperator(const service::Caller& who) {
  return service::RequireOperatorAdmin(who, "the attach-token keys");
}

}  // namespace

Awaitable Routes::CreateTenant(Api& api, Call& call) {
  auto spec = ParseTenantSpec(call.ctx.req.body(), /*create=*/true);
  if (!spec.ok()) co_return Fail(call.ctx, spec.status());
  co_return co_await Answer(call, api.opts_.tenancy->CreateTenant(call.caller, *spec),
                            bhttp::status::created);
}

Awaitable Routes::ListTenants(Api& api, Call& call) {
  co_return co_await Answer(call, api.opts_.tenancy->ListTenants(call.caller));
}

Awaitable Routes::GetTenant(Api& api, Call& call) {
  co_return co_await Answer(call, api.opts_.tenancy->GetTenant(call.caller, call.id));
}

Awaitable Routes::UpdateTenant(Api& api, Call& call) {
  auto spec = ParseTenantSpec(call.ctx.req.body(), /*create=*/false);
  if (!spec.ok()) co_return Fail(call.ctx, spec.status());
  co_return co_await Answer(call, api.opts_.tenancy->UpdateTenant(call.caller, call.id, *spec));
}

// The tenant stops authenticating first, then each of its sandboxes gets a delete operation;
// its row goes once they have all gone (GET answers 404 from then on).
Awaitable Routes::DeleteTenant(Api& api, Call& call) {
  auto live = log::With(call.ctx.log,
                        [&] { return api.opts_.tenancy->BeginDeleteTenant(call.caller, call.id); });
  if (!live.ok()) co_return Fail(call.ctx, live.status());
  if (api.opts_.templates != nullptr) {
    // Its own templates go now (a release a sandbox of it still runs stays until gc).
    auto dropped = log::With(call.ctx.log,
                             [&] { return api.opts_.templates->DeleteNamespace(call.id); });
    if (!dropped.ok()) co_return Fail(call.ctx, Annotate(dropped.status(), "delete its templates"));
  }
  service::Caller owner;
  owner.tenant_id = call.id;
  owner.token_id = call.caller.token_id;
  nlohmann::json ops = nlohmann::json::array();
  for (const std::string& id : *live) {
    auto r = log::With(call.ctx.log, [&] { return api.svc_.DeleteSandbox(owner, id, std::nullopt); });
    if (r.ok() && r->result) {
      ops.push_back(r->result->operation.id);
    } else if (!r.ok() && !absl::IsNotFound(r.status())) {
      // Deleted meanwhile is fine; anything else is said, and a later DELETE tries again.
      co_return Fail(call.ctx, Annotate(r.status(), "delete sandbox " + id + " of the tenant"));
    }
  }
  auto t = api.opts_.tenancy->GetTenant(call.caller, call.id);
  nlohmann::json body = {{"operations", ops}};
  if (t.ok()) body["tenant"] = (*t)["tenant"];
  co_return RenderJson(bhttp::status::accepted, body);
}

Awaitable Routes::CreateToken(Api& api, Call& call) {
  auto spec = ParseTokenSpec(call.ctx.req.body());
  if (!spec.ok()) co_return Fail(call.ctx, spec.status());
  co_return co_await Answer(call, api.opts_.tenancy->CreateToken(call.caller, call.id, *spec),
                            bhttp::status::created);
}

Awaitable Routes::ListTokens(Api& api, Call& call) {
  co_return co_await Answer(call, api.opts_.tenancy->ListTokens(call.caller, call.id));
}

Awaitable Routes::GetToken(Api& api, Call& call) {
  co_return co_await Answer(call, api.opts_.tenancy->GetToken(call.caller, call.id));
}

Awaitable Routes::RevokeToken(Api& api, Call& call) {
  co_return co_await Answer(call, api.opts_.tenancy->RevokeToken(call.caller, call.id));
}

// GET /v1/admin/audit?tenant=&since=&limit=&page_token=
Awaitable Routes::ListAudit(Api& api, Call& call) {
  store::AuditFilter f;
  if (auto t = call.target.Query("tenant"); t && !t->empty()) f.tenant_id = *t;
  if (auto since = call.target.Query("since"); since && !since->empty()) {
    auto at = ParseSince(*since);
    if (!at) {
      co_return Fail(call.ctx, FieldError("since", "must be an RFC 3339 time in UTC "
                                                   "(2026-01-02T03:04:05Z, fractions allowed)"));
    }
    f.since = FormatRfc3339(*at);
  }
  auto limit = ParseLimit(call.target.Query("limit"));
  if (!limit.ok()) co_return Fail(call.ctx, limit.status());
  f.limit = *limit;
  if (auto p = call.target.Query("page_token"); p && !p->empty()) {
    int64_t after = 0;
    auto [end, ec] = std::from_chars(p->data(), p->data() + p->size(), after);
    if (ec != std::errc() || end != p->data() + p->size() || after < 0) {
      co_return Fail(call.ctx, FieldError("page_token", "not a page token of this list"));
    }
    f.after_seq = after;
  }
  co_return co_await Answer(call, api.opts_.tenancy->ListAudit(call.caller, f));
}

Awaitable Routes::AttachKeys(Api& api, Call& call) {
  if (auto st = NeedOperator(call.caller); !st.ok()) co_return Fail(call.ctx, st);
  co_return RenderJson(bhttp::status::ok, api.svc_.AttachKeys().ToJson());
}

// A new key signs from now on; the one it replaces verifies for one token lifetime more.
Awaitable Routes::RotateAttachKey(Api& api, Call& call) {
  if (auto st = NeedOperator(call.caller); !st.ok()) co_return Fail(call.ctx, st);
  auto r = log::With(call.ctx.log, [&] { return api.svc_.RotateAttachKey(); });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  co_return RenderJson(bhttp::status::ok, r->ToJson());
}

// Nodes are the deployment's (docs/scale.md): the operator's admin only.
namespace {

nlohmann::json NodeView(const service::NodeInfo& n) {
  const store::NodeRecord& r = n.record;
  return {{"name", r.name},
          {"url", r.url},
          {"role", r.role},
          {"state", r.state},
          {"reason", r.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.reason)},
          {"epoch", r.epoch},
          {"heartbeat_at", r.heartbeat_at},
          {"heartbeat_age_ms", n.heartbeat_age_ms},
          {"alive", n.fresh && r.state != service::kNodeLost},
          {"restart_by", r.restart_by.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.restart_by)},
          {"started_at", r.started_at},
          {"sandboxes", n.sandboxes},
          {"capacity", r.capacity},
          {"load", r.load},
          {"labels", r.labels}};
}

absl::Status NeedCluster(const service::Caller& who) {
  return service::RequireOperatorAdmin(who, "the nodes");
}

}  // namespace

Awaitable Routes::ListNodes(Api& api, Call& call) {
  if (auto st = NeedCluster(call.caller); !st.ok()) co_return Fail(call.ctx, st);
  if (api.opts_.cluster == nullptr) {
    co_return Fail(call.ctx, ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                                      "this sbxd keeps no node registry"));
  }
  auto nodes = api.opts_.cluster->ListNodes();
  if (!nodes.ok()) co_return Fail(call.ctx, nodes.status());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& n : *nodes) out.push_back(NodeView(n));
  co_return RenderJson(bhttp::status::ok, {{"nodes", out}});
}

namespace {

Awaitable SetDraining(service::Cluster* cluster, Call& call, bool draining) {
  if (cluster == nullptr) {
    co_return Fail(call.ctx, ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                                      "this sbxd keeps no node registry"));
  }
  auto r = cluster->SetDraining(call.id, draining);
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  auto nodes = cluster->ListNodes();
  if (nodes.ok()) {
    for (const auto& n : *nodes) {
      if (n.record.name == call.id) co_return RenderJson(bhttp::status::ok, NodeView(n));
    }
  }
  service::NodeInfo info;
  info.record = *r;
  co_return RenderJson(bhttp::status::ok, NodeView(info));
}

}  // namespace

// Placement stops; the node keeps serving its sandboxes until they end (`sbx admin node drain
// --wait` polls `sandboxes` down to 0).
Awaitable Routes::DrainNode(Api& api, Call& call) {
  if (auto st = NeedCluster(call.caller); !st.ok()) co_return Fail(call.ctx, st);
  co_return co_await SetDraining(api.opts_.cluster, call, true);
}

Awaitable Routes::ActivateNode(Api& api, Call& call) {
  if (auto st = NeedCluster(call.caller); !st.ok()) co_return Fail(call.ctx, st);
  co_return co_await SetDraining(api.opts_.cluster, call, false);
}

}  // namespace sbx::api
