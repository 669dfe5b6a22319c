// The v1 API's route table (routes.cc): method + path pattern -> handler, and how its caller
// authenticates. A new route is one row in kRoutes and one handler, in the file of its resource
// (sandbox_routes.cc, session_routes.cc, operation_routes.cc, system_routes.cc).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "api/api.h"
#include "api/target.h"
#include "http/server.h"
#include "service/inputs.h"

namespace sbx::api {

using Awaitable = http::asio::awaitable<std::optional<http::Response>>;

enum class Auth {
  kNone,     // the health probes
  kMetrics,  // the admin token, unless metrics.public
  kTenant,   // a management token
  kSession,  // a management token, or the attach token of the session in the path
};

// What a handler gets. `caller` is empty for kNone and kMetrics routes.
struct Call {
  http::RequestContext& ctx;
  const service::Caller& caller;
  const Target& target;
  std::string id;      // the path's {id}, "" when it has none (under /v1/admin: the one after
                       // tenants/ or tokens/)
  std::string action;  // the path's last segment after {id} ("pause", "files:list", ...)
};

// The handlers, one per route. Friends of Api: they call its service and its data-plane
// members as they are.
struct Routes {
  using Handler = Awaitable (*)(Api& api, Call& call);

  // system_routes.cc
  static Awaitable Healthz(Api& api, Call& call);
  static Awaitable Readyz(Api& api, Call& call);
  static Awaitable Metrics(Api& api, Call& call);
  // sandbox_routes.cc
  static Awaitable CreateSandbox(Api& api, Call& call);
  static Awaitable ListSandboxes(Api& api, Call& call);
  static Awaitable GetSandbox(Api& api, Call& call);
  static Awaitable DeleteSandbox(Api& api, Call& call);
  static Awaitable Lifecycle(Api& api, Call& call);
  static Awaitable Processes(Api& api, Call& call);
  static Awaitable Files(Api& api, Call& call);
  // session_routes.cc
  static Awaitable CreateSession(Api& api, Call& call);
  static Awaitable GetSession(Api& api, Call& call);
  static Awaitable Attach(Api& api, Call& call);
  static Awaitable SessionIo(Api& api, Call& call);
  static Awaitable WebSocket(Api& api, Call& call);
  // operation_routes.cc
  static Awaitable GetOperation(Api& api, Call& call);
  // egress_routes.cc
  static Awaitable EgressProfiles(Api& api, Call& call);
  static Awaitable Runtimes(Api& api, Call& call);
  static Awaitable SandboxEgress(Api& api, Call& call);
  static Awaitable PatchSandboxEgress(Api& api, Call& call);
  // template_routes.cc
  static Awaitable ImportTemplate(Api& api, Call& call);
  static Awaitable BuildTemplate(Api& api, Call& call);
  static Awaitable OperationEvents(Api& api, Call& call);
  static Awaitable CreateTemplate(Api& api, Call& call);
  static Awaitable ListTemplates(Api& api, Call& call);
  static Awaitable GetTemplate(Api& api, Call& call);
  static Awaitable DeleteTemplate(Api& api, Call& call);
  static Awaitable TagTemplate(Api& api, Call& call);
  static Awaitable TemplateGc(Api& api, Call& call);
  static Awaitable LayerBlob(Api& api, Call& call);
  static Awaitable CancelOperation(Api& api, Call& call);
  // admin_routes.cc
  static Awaitable CreateTenant(Api& api, Call& call);
  static Awaitable ListTenants(Api& api, Call& call);
  static Awaitable GetTenant(Api& api, Call& call);
  static Awaitable UpdateTenant(Api& api, Call& call);
  static Awaitable DeleteTenant(Api& api, Call& call);
  static Awaitable CreateToken(Api& api, Call& call);
  static Awaitable ListTokens(Api& api, Call& call);
  static Awaitable GetToken(Api& api, Call& call);
  static Awaitable RevokeToken(Api& api, Call& call);
  static Awaitable ListAudit(Api& api, Call& call);
  static Awaitable AttachKeys(Api& api, Call& call);
  static Awaitable RotateAttachKey(Api& api, Call& call);
  static Awaitable ListNodes(Api& api, Call& call);
  static Awaitable DrainNode(Api& api, Call& call);
  static Awaitable ActivateNode(Api& api, Call& call);
};

struct Route {
  // GET, POST, ...; std::nullopt: any method (the handler answers 405 itself).
  std::optional<http::bhttp::verb> method;
  // Segments separated by '/': literal, "{id}", or a literal prefix ending in '*' ("files*").
  std::string_view pattern;
  Auth auth;
  // The token scopes that allow it (service/mgmt_token.h), any one of them; 0 for kNone and
  // kMetrics routes. The admin scope allows every route.
  uint32_t scopes;
  Routes::Handler handler;
};

std::span<const Route> RouteTable();
// The URL of GET /v1/admin/layers/{diff_id} on the node at `node_url` (for the other nodes).
std::string LayerBlobUrl(const std::string& node_url, const std::string& diff_id);
// The URL of POST /v1/templates:gc?scope=node (a node collects its own layer store only).
std::string NodeGcUrl(const std::string& node_url);
// Whether `pattern` matches the path's segments.
bool PatternMatches(std::string_view pattern, const std::vector<std::string>& segments);

}  // namespace sbx::api
