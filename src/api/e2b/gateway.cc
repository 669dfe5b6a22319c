// Which requests are E2B's, who sends them, and where they go (e2b.h).
#include <fmt/format.h>

#include "api/e2b/connect.h"
#include "api/e2b/e2b.h"
#include "api/e2b/errors.h"
#include "api/e2b/state.h"
#include "api/handler_util.h"
#include "api/port_target.h"
#include "common/base64.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;

constexpr std::string_view kSandboxIdHeader = "E2b-Sandbox-Id";
constexpr std::string_view kSandboxPortHeader = "E2b-Sandbox-Port";
constexpr std::string_view kAccessTokenHeader = "X-Access-Token";
constexpr std::string_view kApiKeyHeader = "X-API-KEY";

std::optional<std::string> HeaderOf(const http::Request& req, std::string_view name) {
  auto it = req.find(name);
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

bool IsControlPlanePath(const std::vector<std::string>& seg) {
  if (seg.empty()) return false;
  if (seg[0] == "sandboxes") return true;
  return seg.size() >= 2 && seg[0] == "v2" && seg[1] == "sandboxes";
}

// The user an envd request acts as: `Authorization: Basic base64("<user>:")` (the SDKs send it
// only when the caller names a user). A malformed header is refused rather than ignored: the
// caller asked for someone.
absl::StatusOr<std::optional<std::string>> BasicUser(const http::Request& req) {
  auto auth = HeaderOf(req, "Authorization");
  if (!auth) return std::optional<std::string>();
  constexpr std::string_view kBasic = "Basic ";
  if (auth->size() <= kBasic.size() ||
      strncasecmp(auth->c_str(), kBasic.data(), kBasic.size()) != 0) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    "envd takes Authorization: Basic base64(\"<user>:\") only");
  }
  auto decoded = Base64Decode(std::string_view(*auth).substr(kBasic.size()));
  if (!decoded) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    "Authorization: Basic is not valid base64");
  }
  std::string user = decoded->substr(0, decoded->find(':'));
  if (user.empty()) return std::optional<std::string>();
  if (user.size() > 255 || user.find('\0') != std::string::npos) {
    return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                    "the user of Authorization: Basic is not a user name");
  }
  return std::optional<std::string>(std::move(user));
}

// What an envd path names: an RPC of a service, or a REST route.
struct EnvdRoute {
  enum class Kind { kProcess, kFilesystem, kOtherRpc, kHealth, kFiles, kUnknown } kind;
  std::string method;
};

EnvdRoute RouteOf(const Target& t) {
  const auto& seg = t.segments;
  if (seg.size() == 1 && seg[0] == "health") return {EnvdRoute::Kind::kHealth, {}};
  if (seg.size() == 1 && seg[0] == "files") return {EnvdRoute::Kind::kFiles, {}};
  if (seg.size() == 2 && seg[0].find('.') != std::string::npos) {
    if (seg[0] == "process.Process") return {EnvdRoute::Kind::kProcess, seg[1]};
    if (seg[0] == "filesystem.Filesystem") return {EnvdRoute::Kind::kFilesystem, seg[1]};
    return {EnvdRoute::Kind::kOtherRpc, seg[1]};
  }
  return {EnvdRoute::Kind::kUnknown, {}};
}

bool IsRpc(EnvdRoute::Kind k) {
  return k == EnvdRoute::Kind::kProcess || k == EnvdRoute::Kind::kFilesystem ||
         k == EnvdRoute::Kind::kOtherRpc;
}

// The sandbox an envd request is for: its E2b-Sandbox-Id, else the one its envd token names
// ("set1.<id>.<secret>": Python e2b 2.21.1 sends no E2b-Sandbox-Id after Sandbox.connect(id)).
// nullopt: not an envd request. Only the token's secret authenticates (AuthorizeEnvd).
std::optional<std::string> EnvdSandboxOf(const http::Request& req) {
  if (auto id = HeaderOf(req, kSandboxIdHeader)) return id;
  auto token = HeaderOf(req, kAccessTokenHeader);
  if (!token || token->rfind("set1.", 0) != 0) return std::nullopt;
  const size_t dot = token->find('.', 5);
  if (dot == std::string::npos) return std::nullopt;
  auto t = ParseTarget(req.target());
  if (!t.ok() || RouteOf(*t).kind == EnvdRoute::Kind::kUnknown) return std::nullopt;
  return token->substr(5, dot - 5);
}

bool IsControlPlane(const http::Request& req) {
  auto t = ParseTarget(req.target());
  return t.ok() && IsControlPlanePath(t->segments);
}

}  // namespace

bool Gateway::Matches(const http::Request& req) {
  return IsControlPlane(req) || EnvdSandboxOf(req).has_value();
}

bool Gateway::StreamsBody(const http::Request& req) {
  if (IsControlPlane(req) || !EnvdSandboxOf(req)) return false;
  // Another port's request goes to the sandbox's port relay, which streams bodies.
  if (auto port = HeaderOf(req, kSandboxPortHeader); port && *port != std::to_string(kEnvdPort)) {
    return true;
  }
  auto t = ParseTarget(req.target());
  return req.method() == bhttp::verb::post && t.ok() && t->segments.size() == 1 &&
         t->segments[0] == "files";
}

Awaitable Gateway::Handle(Api& api, http::RequestContext& ctx) {
  const http::Request& req = ctx.req;
  // A control-plane path is the control plane whatever else the request carries: Python e2b
  // 2.21.1 sends its connect with the E2b-Sandbox-* headers of the sandbox it connects to.
  std::optional<std::string> id;
  if (!IsControlPlane(req)) id = EnvdSandboxOf(req);
  if (id) {
    uint16_t port = kEnvdPort;
    if (auto p = HeaderOf(req, kSandboxPortHeader)) {
      auto n = ParsePortNumber(*p);
      if (!n.ok()) {
        co_return RestError(ctx, FieldError("E2b-Sandbox-Port", "must be a port number 1-65535"),
                            Side::kEnvd);
      }
      port = *n;
    }
    if (port != kEnvdPort) {
      // The code interpreter's server (49999) and any other: the port relay, as the host-name
      // form {port}-{id}.{domain} would reach it. It checks the credentials itself (the envd
      // token among them).
      PortAddress a;
      a.sandbox_id = SbxSandboxId(*id);
      a.port = port;
      a.upstream_target = std::string(req.target());
      a.by_host = true;
      co_return co_await api.ProxyPort(ctx, std::move(a));
    }
    co_return co_await HandleEnvd(api, ctx, SbxSandboxId(*id));
  }

  auto parsed = ParseTarget(req.target());
  if (!parsed.ok()) co_return RestError(ctx, parsed.status(), Side::kControlPlane);
  auto key = HeaderOf(req, kApiKeyHeader);
  if (!key || key->empty()) {
    co_return RestError(ctx,
                        ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                                 "missing API key (X-API-KEY: an sbx management token)"),
                        Side::kControlPlane);
  }
  auto who = api.AuthenticateToken(*key, /*allow_attach_token=*/false);
  if (!who.ok()) co_return RestError(ctx, who.status(), Side::kControlPlane);
  ctx.log.tenant = who->caller.tenant_id;
  // The token's rate limit, as on the v1 routes.
  if (who->rate_per_s > 0 && !who->caller.token_id.empty()) {
    auto rate = api.rate_limiter_.Take(who->caller.token_id, who->rate_per_s, who->burst,
                                       std::chrono::steady_clock::now());
    if (!rate.allowed) {
      http::Response res = RestError(
          ctx,
          ApiError(absl::StatusCode::kResourceExhausted, "rate_limited",
                   fmt::format("token {} is over its rate of {} requests/s (burst {})",
                               who->caller.token_id, who->rate_per_s, who->burst)),
          Side::kControlPlane);
      for (const auto& [k, v] : service::RateLimitHeaders(rate)) res.set(k, v);
      co_return res;
    }
  }
  std::optional<http::Response> res = co_await ControlPlane(api, ctx, *parsed, who->caller);
  // Management actions are audited as on /v1 (docs/tenancy.md, "Audit"): the sandbox is the
  // path's, or the one a create made.
  if (req.method() != bhttp::verb::get && req.method() != bhttp::verb::head) {
    std::vector<std::string> seg = parsed->segments;
    if (seg.front() == "v2") seg.erase(seg.begin());
    std::string id = seg.size() > 1 ? SbxSandboxId(seg[1]) : std::string();
    if (id.empty() && res && res->result_int() < 300) {
      auto body = ParseUntrustedJson(res->body());
      if (body.ok() && body->is_object()) id = SbxSandboxId(body->value("sandboxID", std::string()));
    }
    api.AuditRequest(ctx, who->caller, {"e2b", "sandboxes", id}, res ? &*res : nullptr);
  }
  co_return res;
}

Awaitable Gateway::HandleEnvd(Api& api, http::RequestContext& ctx, std::string sandbox_id) {
  const http::Request& req = ctx.req;
  auto parsed = ParseTarget(req.target());
  if (!parsed.ok()) co_return RestError(ctx, parsed.status(), Side::kEnvd);
  const Target& t = *parsed;
  const EnvdRoute route = RouteOf(t);
  const bool rpc = IsRpc(route.kind);
  const bool stream = rpc && ShapeOf(req) == Shape::kStream;
  // Errors before the call runs, in the form its client reads: a stream's in its end-of-stream
  // frame (HTTP 200: a status would lose the code), a unary call's as Connect's error body,
  // REST as {code, message}.
  auto fail = [&](const absl::Status& s) -> http::Response {
    if (!rpc) return RestError(ctx, s, Side::kEnvd);
    const RpcError e = RpcErrorFor(s);
    if (!stream) return UnaryError(req, e);
    http::Response res{bhttp::status::ok, req.version()};
    for (const auto& f : StreamHeader(req)) res.set(f.name_string(), f.value());
    res.body() = EndStreamEnvelope(e);
    res.prepare_payload();
    return res;
  };
  // A sandbox that does not exist (or no longer: killed, expired) is what E2B's proxy answers
  // 502 for, which the SDKs read as "not running" (isRunning() false, TimeoutError): a 404
  // would read as a missing file.
  auto gone = [&]() {
    return ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running",
                    fmt::format("sandbox {} not found", sandbox_id));
  };
  if (!IsValidId(sandbox_id, "sbx")) co_return fail(gone());
  ctx.log.sandbox = sandbox_id;
  auto owner = log::With(ctx.log, [&] {
    return api.svc_.AuthorizeEnvd(sandbox_id, HeaderOf(req, kAccessTokenHeader));
  });
  if (!owner.ok()) {
    co_return fail(owner.status().code() == absl::StatusCode::kNotFound ? gone() : owner.status());
  }
  ctx.log.tenant = owner->tenant_id;
  auto user = BasicUser(req);
  if (!user.ok()) co_return fail(user.status());
  if (rpc && req.method() != bhttp::verb::post) {
    co_return fail(MethodNotAllowed(req, "POST"));
  }
  if (rpc && ShapeOf(req) == Shape::kUnsupported) {
    co_return fail(ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                            "envd speaks Connect's JSON codec: Content-Type application/json "
                            "(unary) or application/connect+json (streams)"));
  }
  if (route.kind == EnvdRoute::Kind::kUnknown) {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("envd has no route {}", t.path)));
  }
  if (route.kind == EnvdRoute::Kind::kOtherRpc) {
    co_return fail(ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                            fmt::format("envd has no service {}", t.segments[0])));
  }
  auto agent = log::With(ctx.log, [&] { return api.svc_.SandboxAgent(*owner, sandbox_id); });
  if (!agent.ok()) co_return fail(agent.status());
  if (route.kind == EnvdRoute::Kind::kHealth) {
    if (req.method() != bhttp::verb::get && req.method() != bhttp::verb::head) {
      co_return fail(MethodNotAllowed(req, "GET, HEAD"));
    }
    co_return RestEmpty(ctx, 204);
  }
  EnvdCall call{api, *api.e2b_, ctx, t, std::move(*owner), sandbox_id, std::move(*agent), std::move(*user)};
  switch (route.kind) {
    case EnvdRoute::Kind::kProcess:
      co_return co_await ProcessRpc(call, route.method);
    case EnvdRoute::Kind::kFilesystem:
      co_return co_await FilesystemRpc(call, route.method);
    default:
      co_return co_await FilesRest(call);
  }
}

}  // namespace sbx::api::e2b
