#include "api/routes.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "api/handler_util.h"
#include "api/render.h"
#include "common/digest.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "service/idempotency.h"
#include "service/template_service.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using bhttp::verb;
using nlohmann::json;

// Rows of one pattern sit together and share their Auth. Order matters only where patterns
// overlap (none do).
constexpr uint32_t kRead = static_cast<uint32_t>(service::Scope::kRead);
constexpr uint32_t kSandboxes = static_cast<uint32_t>(service::Scope::kSandboxes);
constexpr uint32_t kSessions = static_cast<uint32_t>(service::Scope::kSessions);
constexpr uint32_t kFiles = static_cast<uint32_t>(service::Scope::kFiles);
constexpr uint32_t kTemplates = static_cast<uint32_t>(service::Scope::kTemplates);
constexpr uint32_t kAdmin = static_cast<uint32_t>(service::Scope::kAdmin);

constexpr Route kRoutes[] = {
    {verb::get, "healthz", Auth::kNone, 0, &Routes::Healthz},
    {verb::head, "healthz", Auth::kNone, 0, &Routes::Healthz},
    {verb::get, "readyz", Auth::kNone, 0, &Routes::Readyz},
    {verb::head, "readyz", Auth::kNone, 0, &Routes::Readyz},
    {verb::get, "metrics", Auth::kMetrics, 0, &Routes::Metrics},

    {verb::post, "v1/sandboxes", Auth::kTenant, kSandboxes, &Routes::CreateSandbox},
    {verb::get, "v1/sandboxes", Auth::kTenant, kRead, &Routes::ListSandboxes},
    {verb::get, "v1/sandboxes/{id}", Auth::kTenant, kRead, &Routes::GetSandbox},
    {verb::delete_, "v1/sandboxes/{id}", Auth::kTenant, kSandboxes, &Routes::DeleteSandbox},
    {verb::post, "v1/sandboxes/{id}/pause", Auth::kTenant, kSandboxes, &Routes::Lifecycle},
    {verb::post, "v1/sandboxes/{id}/suspend", Auth::kTenant, kSandboxes, &Routes::Lifecycle},
    {verb::post, "v1/sandboxes/{id}/wake", Auth::kTenant, kSandboxes, &Routes::Lifecycle},
    {verb::post, "v1/sandboxes/{id}/sessions", Auth::kTenant, kSessions, &Routes::CreateSession},
    {std::nullopt, "v1/sandboxes/{id}/processes", Auth::kTenant, kSessions, &Routes::Processes},
    {std::nullopt, "v1/sandboxes/{id}/files*", Auth::kTenant, kFiles, &Routes::Files},
    {verb::get, "v1/sandboxes/{id}/egress", Auth::kTenant, kRead, &Routes::SandboxEgress},
    {verb::patch, "v1/sandboxes/{id}/egress", Auth::kTenant, kSandboxes,
     &Routes::PatchSandboxEgress},

    {verb::get, "v1/egress-profiles", Auth::kTenant, kRead, &Routes::EgressProfiles},
    {verb::get, "v1/runtimes", Auth::kTenant, kRead, &Routes::Runtimes},

    {verb::get, "v1/operations/{id}", Auth::kTenant, kRead, &Routes::GetOperation},
    {verb::get, "v1/operations/{id}/events", Auth::kTenant, kRead, &Routes::OperationEvents},
    // Sandbox operations and template builds alike: either scope may cancel (the service
    // checks the operation is the caller tenant's).
    {verb::delete_, "v1/operations/{id}", Auth::kTenant, kSandboxes | kTemplates,
     &Routes::CancelOperation},

    {verb::post, "v1/templates:import", Auth::kTenant, kTemplates, &Routes::ImportTemplate},
    {verb::post, "v1/templates:build", Auth::kTenant, kTemplates, &Routes::BuildTemplate},
    {verb::post, "v1/templates:gc", Auth::kTenant, kTemplates, &Routes::TemplateGc},
    {verb::post, "v1/templates", Auth::kTenant, kTemplates, &Routes::CreateTemplate},
    {verb::get, "v1/templates", Auth::kTenant, kRead, &Routes::ListTemplates},
    {verb::get, "v1/templates/{id}", Auth::kTenant, kRead, &Routes::GetTemplate},
    {verb::delete_, "v1/templates/{id}", Auth::kTenant, kTemplates, &Routes::DeleteTemplate},
    {verb::put, "v1/templates/{id}", Auth::kTenant, kTemplates, &Routes::TagTemplate},

    {verb::get, "v1/sessions/{id}", Auth::kTenant, kRead | kSessions, &Routes::GetSession},
    // The session's data plane also accepts its attach token (DESIGN.md).
    {verb::get, "v1/sessions/{id}/attach", Auth::kSession, kSessions, &Routes::Attach},
    {std::nullopt, "v1/sessions/{id}/stdin", Auth::kSession, kSessions, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/stdin:close", Auth::kSession, kSessions, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/signal", Auth::kSession, kSessions, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/resize", Auth::kSession, kSessions, &Routes::SessionIo},
    {std::nullopt, "v1/sessions/{id}/ws", Auth::kSession, kSessions, &Routes::WebSocket},

    // Tenancy (admin_routes.cc, docs/tenancy.md).
    {verb::post, "v1/admin/tenants", Auth::kTenant, kAdmin, &Routes::CreateTenant},
    {verb::get, "v1/admin/tenants", Auth::kTenant, kAdmin, &Routes::ListTenants},
    {verb::get, "v1/admin/tenants/{id}", Auth::kTenant, kAdmin, &Routes::GetTenant},
    {verb::patch, "v1/admin/tenants/{id}", Auth::kTenant, kAdmin, &Routes::UpdateTenant},
    {verb::delete_, "v1/admin/tenants/{id}", Auth::kTenant, kAdmin, &Routes::DeleteTenant},
    {verb::post, "v1/admin/tenants/{id}/tokens", Auth::kTenant, kAdmin, &Routes::CreateToken},
    {verb::get, "v1/admin/tenants/{id}/tokens", Auth::kTenant, kAdmin, &Routes::ListTokens},
    {verb::get, "v1/admin/tokens/{id}", Auth::kTenant, kAdmin, &Routes::GetToken},
    {verb::delete_, "v1/admin/tokens/{id}", Auth::kTenant, kAdmin, &Routes::RevokeToken},
    {verb::get, "v1/admin/audit", Auth::kTenant, kAdmin, &Routes::ListAudit},
    {verb::get, "v1/admin/attach-keys", Auth::kTenant, kAdmin, &Routes::AttachKeys},
    {verb::post, "v1/admin/attach-keys:rotate", Auth::kTenant, kAdmin, &Routes::RotateAttachKey},
    {verb::get, "v1/admin/nodes", Auth::kTenant, kAdmin, &Routes::ListNodes},
    {verb::post, "v1/admin/nodes/{id}/drain", Auth::kTenant, kAdmin, &Routes::DrainNode},
    {verb::post, "v1/admin/nodes/{id}/activate", Auth::kTenant, kAdmin, &Routes::ActivateNode},
    // A node's layer blobs, for the other nodes of its cluster (template_peers.cc).
    {verb::get, "v1/admin/layers/{id}", Auth::kTenant, kAdmin, &Routes::LayerBlob},
};

}  // namespace

std::span<const Route> RouteTable() { return kRoutes; }

std::string LayerBlobUrl(const std::string& node_url, const std::string& diff_id) {
  return node_url + "/v1/admin/layers/" + diff_id;
}

std::string NodeGcUrl(const std::string& node_url) {
  return node_url + "/v1/templates:gc?scope=node";
}

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

absl::Status MissingScope(service::Scope scope, const std::string& what) {
  return WithDetail(ApiError(absl::StatusCode::kPermissionDenied, "missing_scope",
                             fmt::format("{} needs a token with the scope {}", what,
                                         service::ScopeName(scope))),
                    "scope", service::ScopeName(scope));
}

constexpr auto kIdempotencyWait = std::chrono::seconds(60);
constexpr auto kIdempotencyAbandoned = std::chrono::seconds(600);
constexpr auto kIdempotencyPoll = std::chrono::milliseconds(50);

// The Idempotency-Key of a mutating request that the router keeps ("" for none). The routes
// whose service call records its own (create, delete, lifecycle, session creation) are left to
// themselves.
absl::StatusOr<std::string> IdempotencyKeyOf(const http::Request& req, const api::Route& route) {
  if (req.method() == verb::get || req.method() == verb::head) return std::string();
  auto it = req.find("Idempotency-Key");
  if (it == req.end()) return std::string();
  if (route.handler == &Routes::CreateSandbox || route.handler == &Routes::DeleteSandbox ||
      route.handler == &Routes::Lifecycle || route.handler == &Routes::CreateSession ||
      route.handler == &Routes::WebSocket) {
    return std::string();
  }
  std::string key(it->value());
  SBX_RETURN_IF_ERROR(ValidateIdempotencyKey(key));
  return key;
}

// A streamed request's body as its handler reads it, hashed on the way behind the fingerprint's
// head (method and target): the hash is then the one a buffered request with the same bytes
// gets, and no byte is held.
class HashingBody final : public http::BodyReader {
 public:
  HashingBody(http::BodyReader& inner, std::string_view head) : inner_(inner) {
    sha_.Update(head.data(), head.size());
  }
  http::asio::awaitable<absl::StatusOr<size_t>> ReadSome(char* buf, size_t cap) override {
    absl::StatusOr<size_t> n = co_await inner_.ReadSome(buf, cap);
    if (n.ok()) {
      sha_.Update(buf, *n);
      read_ += *n;
    }
    co_return n;
  }
  bool done() const override { return inner_.done(); }
  uint64_t read() const { return read_; }
  // The fingerprint (Sha256Hex's form) once the body was read to its end; "" before.
  std::string Hash() {
    if (!inner_.done()) return std::string();
    std::string digest = sha_.Digest();  // "sha256:<hex>"
    return digest.substr(digest.find(':') + 1);
  }

 private:
  http::BodyReader& inner_;
  Sha256Stream sha_;
  uint64_t read_ = 0;
};

// Reads the rest of `body` so that its hash is known, failing past `limit` bytes (0: only the
// server's own bound), as the route would have.
http::asio::awaitable<absl::Status> ReadToEnd(HashingBody& body, uint64_t limit) {
  std::vector<char> sink(256 << 10);
  while (!body.done()) {
    absl::StatusOr<size_t> n = co_await body.ReadSome(sink.data(), sink.size());
    if (!n.ok()) co_return Annotate(n.status(), "read the body to compare it");
    if (*n == 0) break;
    if (limit > 0 && body.read() > limit) {
      co_return ApiError(absl::StatusCode::kInvalidArgument, "payload_too_large",
                         fmt::format("request body is larger than this route's {} bytes", limit));
    }
  }
  co_return absl::OkStatus();
}

// Gives the key back if the request ends between its claim and its answer without recording
// one (a handler that threw, a coroutine destroyed with its connection): a duplicate then runs
// instead of waiting out the claim.
class ClaimHold {
 public:
  ClaimHold(store::Store& store, const service::IdempotencyKey& k) : store_(store), k_(k) {}
  ClaimHold(const ClaimHold&) = delete;
  ClaimHold& operator=(const ClaimHold&) = delete;
  ~ClaimHold() {
    if (!held_) return;
    service::IdempotencyKey released = k_;
    released.body_hash.clear();
    absl::Status st = service::FinishIdempotent(store_, released, 0, "");
    if (!st.ok()) {
      spdlog::warn("idempotency: the claim of {} {} was not given back: {}", k_.method, k_.route,
                   std::string(st.message()));
    }
  }
  absl::Status Finish(int status, const std::string& body) {
    held_ = false;
    return service::FinishIdempotent(store_, k_, status, body);
  }

 private:
  store::Store& store_;
  const service::IdempotencyKey& k_;
  bool held_ = true;
};

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

  service::Principal who;
  service::Caller& caller = who.caller;
  if (auth == Auth::kMetrics && !opts_.metrics_public) {
    // The operator's admin only: an attach token names one session, a tenant's token its
    // tenant, not the deployment.
    auto c = Authenticate(req, std::nullopt, /*allow_attach_token=*/false);
    if (!c.ok()) co_return Fail(ctx, c.status());
    if (auto st = service::RequireOperatorAdmin(c->caller, "GET /metrics"); !st.ok()) {
      co_return Fail(ctx, st);
    }
  } else if (auth == Auth::kTenant || auth == Auth::kSession) {
    auto c = Authenticate(req, t.Query("token"), auth == Auth::kSession);
    if (!c.ok()) co_return Fail(ctx, c.status());
    who = std::move(*c);
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
  if (route == nullptr) {
    std::string allow;  // every row here names its method: one without would have matched
    for (const api::Route* r : rows) {
      if (!allow.empty()) allow += ", ";
      allow += std::string(http::bhttp::to_string(*r->method));
    }
    co_return Fail(ctx, MethodNotAllowed(req, allow));
  }
  if (auth == Auth::kSession && caller.session_scope && *caller.session_scope != seg[2]) {
    co_return Fail(ctx, ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                                 "the attach token belongs to another session"));
  }
  // Rate first: a token over its rate learns nothing more, and costs nothing more.
  std::optional<service::RateLimiter::Decision> rate;
  if (who.rate_per_s > 0 && !caller.token_id.empty()) {
    rate = rate_limiter_.Take(caller.token_id, who.rate_per_s, who.burst,
                              std::chrono::steady_clock::now());
    if (!rate->allowed) {
      http::Response res = Fail(ctx, ApiError(absl::StatusCode::kResourceExhausted, "rate_limited",
                                              fmt::format("token {} is over its rate of {} "
                                                          "requests/s (burst {})",
                                                          caller.token_id, who.rate_per_s,
                                                          who.burst)));
      for (const auto& [k, v] : service::RateLimitHeaders(*rate)) res.set(k, v);
      co_return res;
    }
  }
  const bool admin_route = seg.size() > 1 && seg[1] == "admin";
  std::optional<http::Response> res;
  if (auth != Auth::kNone && auth != Auth::kMetrics && (caller.scopes & route->scopes) == 0 &&
      !service::HasScope(caller.scopes, service::Scope::kAdmin)) {
    res = Fail(ctx, MissingScope(static_cast<service::Scope>(route->scopes & (~route->scopes + 1)),
                                 fmt::format("{} {}", std::string(req.method_string()),
                                             route->pattern)));
  } else if (admin_route && opts_.tenancy == nullptr) {
    res = Fail(ctx, ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                             "tenancy is not configured on this sbxd"));
  } else {
    std::string id = seg.size() > 2 ? seg[2] : std::string();
    std::string action = seg.size() > 3 ? seg[3] : std::string();
    if (admin_route) {
      id = seg.size() > 3 ? seg[3] : std::string();
      action = seg.size() > 4 ? seg[4] : std::string();
    }
    Call call{ctx, caller, t, std::move(id), std::move(action)};
    auto key = IdempotencyKeyOf(req, *route);
    if (!key.ok()) {
      res = Fail(ctx, key.status());
    } else if (key->empty()) {
      res = co_await route->handler(*this, call);
    } else {
      res = co_await RunIdempotent(ctx, caller, *key, *route, call);
    }
  }
  // A request on a sandbox its TTL deleted fails as it would on any deleted one; the answer
  // says so (410) instead. Only on failure: a success costs no extra read.
  if (res && (res->result_int() == 404 || res->result_int() == 409) && seg.size() > 2 &&
      (seg[1] == "sandboxes" || seg[1] == "sessions") &&
      !(seg.size() == 3 && seg[1] == "sandboxes")) {
    absl::Status expired =
        log::With(ctx.log, [&] { return svc_.ExpiredError(caller, seg[2]); });
    if (!expired.ok()) res = Fail(ctx, expired);
  }
  if (res && rate) {
    for (const auto& [k, v] : service::RateLimitHeaders(*rate)) res->set(k, v);
  }
  if (auth == Auth::kTenant || auth == Auth::kSession) {
    AuditRequest(ctx, caller, seg, res ? &*res : nullptr);
  }
  co_return res;
}

Awaitable Api::RunIdempotent(http::RequestContext& ctx, const service::Caller& caller,
                             const std::string& key, const api::Route& route, Call& call) {
  service::IdempotencyKey k;
  k.tenant_id = caller.tenant_id;
  k.key = key;
  k.method = std::string(ctx.req.method_string());
  const std::string target(ctx.req.target());
  k.route = target.substr(0, target.find('?'));
  // The query is part of the request (a file's path is there): in the hash, not the route.
  const std::string head = fmt::format("{}\n{}\n", k.method, target);
  // A streamed body is hashed as it is read (HashingBody); its key carries no hash till then.
  std::optional<HashingBody> hashing;
  if (ctx.body != nullptr) {
    hashing.emplace(*ctx.body, head);
  } else {
    k.body_hash = Sha256Hex(head + ctx.req.body());
  }
  const auto deadline = std::chrono::steady_clock::now() + kIdempotencyWait;
  for (;;) {
    auto claim = log::With(ctx.log, [&] {
      return service::ClaimIdempotent(svc_.store(), k, kIdempotencyAbandoned);
    });
    if (!claim.ok()) co_return Fail(ctx, claim.status());
    if (auto* r = std::get_if<service::Replay>(&*claim)) {
      if (hashing) {
        // A duplicate of a finished upload: the same request only if its bytes are the same.
        absl::Status read = co_await ReadToEnd(*hashing, StreamedBodyLimit(ctx, caller, call));
        if (!read.ok()) co_return Fail(ctx, read);
        if (hashing->Hash() != r->body_hash) co_return Fail(ctx, service::KeyReusedError());
      }
      co_return RenderAnswer(service::Rendered{r->status, r->body}, /*replayed=*/true);
    }
    if (std::holds_alternative<service::Claimed>(*claim)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      co_return Fail(ctx, ApiError(absl::StatusCode::kFailedPrecondition,
                                   "idempotency_key_in_progress",
                                   "a request with this Idempotency-Key is still running"));
    }
    // The duplicate in flight is another request, perhaps on another sbxd: its answer shows
    // in the store. A streamed body waits unread meanwhile: if the first gives the key back,
    // this one runs with it.
    http::asio::steady_timer timer(ctx.executor, kIdempotencyPoll);
    boost::system::error_code ec;
    co_await timer.async_wait(http::asio::redirect_error(http::asio::use_awaitable, ec));
  }
  ClaimHold hold(svc_.store(), k);
  http::BodyReader* const raw_body = ctx.body;
  if (hashing) ctx.body = &*hashing;
  std::optional<http::Response> res = co_await route.handler(*this, call);
  ctx.body = raw_body;
  // A body the handler left unread has no hash: the key is given back (FinishIdempotent), as
  // the handler answered before it took the request in.
  if (hashing) k.body_hash = hashing->Hash();
  const bool json = res && res->find(bhttp::field::content_type) != res->end() &&
                    (*res)[bhttp::field::content_type] == "application/json";
  absl::Status saved = hold.Finish(res && json ? static_cast<int>(res->result_int()) : 0,
                                   res && json ? res->body() : std::string());
  if (!saved.ok()) {
    spdlog::warn("idempotency: the answer to {} {} was not recorded: {}", k.method, k.route,
                 std::string(saved.message()));
  }
  co_return res;
}

uint64_t Api::StreamedBodyLimit(http::RequestContext& ctx, const service::Caller& caller,
                                const Call& call) {
  const auto& seg = call.target.segments;
  if (seg.size() > 1 && seg[1].rfind("templates", 0) == 0) {
    return opts_.templates != nullptr ? opts_.templates->max_archive_bytes() : 0;
  }
  if (seg.size() > 2 && seg[1] == "sandboxes") {
    // A sandbox gone since the first upload has no cap left: the server's bound stays.
    auto sb = log::With(ctx.log, [&] { return svc_.GetSandbox(caller, seg[2]); });
    if (!sb.ok()) return 0;
    auto d = sb->effective_resources.find("disk_mib");
    if (d != sb->effective_resources.end() && d->is_number_integer() && d->get<int64_t>() > 0) {
      return static_cast<uint64_t>(d->get<int64_t>()) << 20;
    }
  }
  return 0;
}

// Management actions: every request that may change something, by a management token, except
// a session's high-rate data plane (stdin, resize: an interactive session would fill the log)
// and WebSocket upgrades (GET).
void Api::AuditRequest(const http::RequestContext& ctx, const service::Caller& caller,
                       const std::vector<std::string>& seg, const http::Response* res) {
  if (opts_.tenancy == nullptr || caller.token_id.empty()) return;
  const auto method = ctx.req.method();
  if (method == verb::get || method == verb::head) return;
  if (seg.size() > 3 && seg[1] == "sessions" && (seg[3] == "stdin" || seg[3] == "resize")) {
    return;
  }
  store::AuditRecord rec;
  rec.tenant_id = caller.tenant_id;
  rec.token_id = caller.token_id;
  std::string path(ctx.req.target());
  path = path.substr(0, path.find('?'));
  rec.action = fmt::format("{} {}", std::string(ctx.req.method_string()), path);
  if (rec.action.size() > 512) rec.action.resize(512);
  rec.request_id = ctx.request_id;
  // Without a response: a WebSocket's 101, else what a streamed answer began with (an
  // attach's 200, not the 101 every stream was logged with before).
  rec.status = res != nullptr            ? static_cast<int>(res->result_int())
               : ctx.taken_status != 0   ? static_cast<int>(ctx.taken_status)
                                         : static_cast<int>(ctx.stream.status());
  // The object acted on: the path's, else the one the answer made.
  const bool admin = seg.size() > 1 && seg[1] == "admin";
  const size_t id_at = admin ? 3 : 2;
  if (seg.size() > id_at && seg[id_at].size() <= 256) rec.target = seg[id_at];
  if (res != nullptr && (rec.target.empty() || rec.status >= 400)) {
    auto body = ParseUntrustedJson(res->body());
    if (body.ok() && body->is_object()) {
      if (rec.status >= 400) {
        const auto& err = (*body)["error"];
        if (err.is_object() && err.value("code", json()).is_string()) rec.code = err["code"];
      } else {
        for (const char* k : {"sandbox", "tenant", "token", "session", "operation", "template"}) {
          const auto it = body->find(k);
          if (it != body->end() && it->is_object() && it->value("id", json()).is_string()) {
            rec.target = (*it)["id"];
            break;
          }
        }
        if (rec.target.empty() && body->value("session_id", json()).is_string()) {
          rec.target = (*body)["session_id"];
        }
      }
    }
  }
  opts_.tenancy->Audit(std::move(rec));
}

}  // namespace sbx::api
