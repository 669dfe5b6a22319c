// /v1/sandboxes/{id}/sessions and /v1/sessions/{id}[/...]. The data plane (attach, stdin,
// signal, resize, ws) is api.cc's Attach, session_io.cc and session_ws.cc.
#include <nlohmann/json.hpp>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/agent_client.h"
#include "service/views.h"

namespace sbx::api {

namespace bhttp = http::bhttp;
using nlohmann::json;

namespace {

// `?attach=true`: answer with the new session's attach stream instead of its 201, so that a
// command costs one request, not two (docs/api.md, "Create and attach in one request").
absl::StatusOr<bool> WantsAttach(const Target& t) {
  std::optional<std::string> v = t.Query("attach");
  if (!v || *v == "false") return false;
  if (*v == "true") return true;
  return FieldError("attach", "must be \"true\" or \"false\"");
}

// The session a stored answer (an Idempotency-Key's replay) created.
absl::StatusOr<std::string> ReplayedSessionId(const service::Rendered& replay) {
  const json body = json::parse(replay.body, nullptr, false);
  if (body.is_object()) {
    if (auto it = body.find("session_id"); it != body.end() && it->is_string()) {
      return it->get<std::string>();
    }
  }
  return absl::InternalError("create session: the stored answer of this Idempotency-Key names no session");
}

}  // namespace

Awaitable Routes::CreateSession(Api& api, Call& call) {
  // Every part of the request is checked before anything is created.
  auto attach = WantsAttach(call.target);
  if (!attach.ok()) co_return Fail(call.ctx, attach.status());
  auto body = ParseCreateSession(call.ctx.req.body());
  if (!body.ok()) co_return Fail(call.ctx, body.status());
  auto idem = IdempotencyFor(call.ctx.req, "/v1/sandboxes/" + call.id + "/sessions");
  if (!idem.ok()) co_return Fail(call.ctx, idem.status());
  if (*attach) {
    // The attach stream's form is checked too: a 400 after the session exists would leave it
    // behind for a client that was told its request failed.
    if (auto form = WantsBinaryAttach(call.ctx.req, call.target); !form.ok()) {
      co_return Fail(call.ctx, form.status());
    }
  }
  auto r = log::With(call.ctx.log, [&] {
    return api.svc_.CreateSession(call.caller, call.id, *body, *idem);
  });
  if (!r.ok()) co_return Fail(call.ctx, r.status());
  if (!*attach) co_return RenderAnswer(*r);
  Api::CreatedHere created;
  if (r->replay) {
    auto id = ReplayedSessionId(*r->replay);
    if (!id.ok()) co_return Fail(call.ctx, id.status());
    created.session_id = std::move(*id);
    created.replayed = true;
  } else {
    created.session_id = r->result->session.id;
  }
  co_return co_await api.Attach(call.ctx, call.caller, created.session_id, call.target, &created);
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
