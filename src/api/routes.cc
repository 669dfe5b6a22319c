#include "api/routes.h"

#include <fmt/format.h>

#include "api/handler_util.h"
#include "common/ids.h"
#include "common/status_util.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using bhttp::verb;

// Rows of one pattern sit together and share their Auth. Order matters only where patterns
// overlap (none do).
constexpr Route kRoutes[] = {
    {verb::get, "healthz", Auth::kNone, &Routes::Healthz},
    {verb::head, "healthz", Auth::kNone, &Routes::Healthz},
    {verb::get, "readyz", Auth::kNone, &Routes::Readyz},
    {verb::head, "readyz", Auth::kNone, &Routes::Readyz},
    {verb::get, "metrics", Auth::kMetrics, &Routes::Metrics},

    {verb::post, "v1/sandboxes", Auth::kTenant, &Routes::CreateSandbox},
    {verb::get, "v1/sandboxes", Auth::kTenant, &Routes::ListSandboxes},
    {verb::get, "v1/sandboxes/{id}", Auth::kTenant, &Routes::GetSandbox},
    {verb::delete_, "v1/sandboxes/{id}", Auth::kTenant, &Routes::DeleteSandbox},
    {verb::post, "v1/sandboxes/{id}/pause", Auth::kTenant, &Routes::Lifecycle},
    {verb::post, "v1/sandboxes/{id}/suspend", Auth::kTenant, &Routes::Lifecycle},
    {verb::post, "v1/sandboxes/{id}/wake", Auth::kTenant, &Routes::Lifecycle},
    {verb::post, "v1/sandboxes/{id}/sessions", Auth::kTenant, &Routes::CreateSession},
    {std::nullopt, "v1/sandboxes/{id}/processes", Auth::kTenant, &Routes::Processes},
    {std::nullopt, "v1/sandboxes/{id}/files*", Auth::kTenant, &Routes::Files},
    {verb::get, "v1/sandboxes/{id}/egress", Auth::kTenant, &Routes::SandboxEgress},
    {verb::patch, "v1/sandboxes/{id}/egress", Auth::kTenant, &Routes::PatchSandboxEgress},

    {verb::get, "v1/egress-profiles", Auth::kTenant, &Routes::EgressProfiles},

    {verb::get, "v1/operations/{id}", Auth::kTenant, &Routes::GetOperation},
    {verb::get, "v1/operations/{id}/events", Auth::kTenant, &Routes::OperationEvents},
    {verb::delete_, "v1/operations/{id}", Auth::kTenant, &Routes::CancelOperation},

    {verb::post, "v1/templates:import", Auth::kTenant, &Routes::ImportTemplate},
    {verb::post, "v1/templates:build", Auth::kTenant, &Routes::BuildTemplate},
    {verb::post, "v1/templates:gc", Auth::kTenant, &Routes::TemplateGc},
    {verb::post, "v1/templates", Auth::kTenant, &Routes::CreateTemplate},
    {verb::get, "v1/templates", Auth::kTenant, &Routes::ListTemplates},
    {verb::get, "v1/templates/{id}", Auth::kTenant, &Routes::GetTemplate},
    {verb::delete_, "v1/templates/{id}", Auth::kTenant, &Routes::DeleteTemplate},
    {verb::put, "v1/templates/{id}", Auth::kTenant, &Routes::TagTemplate},

    {verb::get, "v1/sessions/{id}", Auth::kTenant, &Routes::GetSession},
    // The session's data plane also accepts its attach token (DESIGN.md).
    {verb::get, "v1/sessions/{id}/attach", Auth::kSession, &Routes::Attach},
    {std::nullopt, "v1/sessions/{id}/stdin", Auth::kSession, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/stdin:close", Auth::kSession, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/signal", Auth::kSession, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/resize", Auth::kSession, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/ws", Auth::kSession, &Routes::WebSocket},
};

}  // namespace

std::span<const Route> RouteTable() { return kRoutes; }

bool PatternMatches(std::string_view pattern, const std::vector<std::string>& segments) {
  size_t i = 0;
  for (;;) {
    const size_t slash = pattern.find('/');
    const std::string_view part = pattern.substr(0, slash);
    if (i >= segments.size()) return false;
    const std::string& seg = segments[i++];
    if (part == "{id}") {
      // Any segment: the service checks the id.
    } else if (!part.empty() && part.back() == '*') {
      if (seg.rfind(part.substr(0, part.size() - 1), 0) != 0) return false;
    } else if (seg != part) {
      return false;
    }
    if (slash == std::string_view::npos) return i == segments.size();
    pattern.remove_prefix(slash + 1);
  }
}

namespace {

// Every line about the request from here on names the tenant and the object in the path.
// Only well-formed ids: the path is the client's, and the log is not its notepad.
void NameInLog(http::RequestContext& ctx, const service::Caller& caller,
               const std::vector<std::string>& seg) {
  ctx.log.tenant = caller.tenant_id;
  if (seg.size() < 3) return;
  std::string* field = seg[1] == "sandboxes"    ? &ctx.log.sandbox
                       : seg[1] == "sessions"   ? &ctx.log.session
                       : seg[1] == "operations" ? &ctx.log.operation
                                                : nullptr;
  const char* prefix = seg[1] == "sandboxes" ? "sbx" : seg[1] == "sessions" ? "ses" : "op";
  if (field && IsValidId(seg[2], prefix)) *field = seg[2];
}

absl::Status NoRoute(const Target& t) {
  return ApiError(absl::StatusCode::kNotFound, "not_found", fmt::format("no route for {}", t.path));
}

}  // namespace

// Order of the answers: a target that does not parse; then, for a known path, its
// authentication, then its method (405); an unknown path is 404, after authentication under
// /v1 (an unauthenticated client learns nothing of the API's paths).
Awaitable Api::Route(http::RequestContext& ctx) {
  const http::Request& req = ctx.req;
  auto parsed = ParseTarget(req.target());
  if (!parsed.ok()) co_return Fail(ctx, parsed.status());
  const Target& t = *parsed;
  const auto& seg = t.segments;

  std::vector<const api::Route*> rows;
  for (const api::Route& r : kRoutes) {
    if (PatternMatches(r.pattern, seg)) rows.push_back(&r);
  }
  const bool under_v1 = !seg.empty() && seg[0] == "v1";
  if (rows.empty() && !under_v1) co_return Fail(ctx, NoRoute(t));
  const Auth auth = rows.empty() ? Auth::kTenant : rows.front()->auth;

  service::Caller caller;
  if (auth == Auth::kMetrics && !opts_.metrics_public) {
    // Admin token only: an attach token names one session, not the deployment.
    auto c = Authenticate(req, std::nullopt, /*allow_attach_token=*/false);
    if (!c.ok()) co_return Fail(ctx, c.status());
  } else if (auth == Auth::kTenant || auth == Auth::kSession) {
    auto c = Authenticate(req, t.Query("token"), auth == Auth::kSession);
    if (!c.ok()) co_return Fail(ctx, c.status());
    caller = std::move(*c);
    // Handlers are coroutines: ctx.log goes along explicitly, and service calls (synchronous)
    // run inside log::With, whose scope cannot span a co_await (common/log.h).
    NameInLog(ctx, caller, seg);
    if (caller.session_scope && auth != Auth::kSession) {
      co_return Fail(ctx, ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                                   "an attach token is valid only for its session's data plane "
                                   "(attach, ws, stdin, signal, resize)"));
    }
  }
  if (rows.empty()) co_return Fail(ctx, NoRoute(t));

  const api::Route* route = nullptr;
  for (const api::Route* r : rows) {
    if (!r->method || *r->method == req.method()) {
      route = r;
      break;
    }
  }
  if (route == nullptr) co_return Fail(ctx, MethodNotAllowed(req));
  if (auth == Auth::kSession && caller.session_scope && *caller.session_scope != seg[2]) {
    co_return Fail(ctx, ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                                 "the attach token belongs to another session"));
  }
  Call call{ctx, caller, t, seg.size() > 2 ? seg[2] : std::string(),
            seg.size() > 3 ? seg[3] : std::string()};
  co_return co_await route->handler(*this, call);
}

}  // namespace sbx::api
