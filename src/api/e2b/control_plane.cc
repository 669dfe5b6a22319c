// E2B's control plane (e2b-compat.md §4) over sbx's sandbox service: create, list, info, kill,
// timeout, pause/resume/connect. Bodies are translated into sbx's own requests and parsed by
// the same parsers (api/requests.h), so every limit and check of /v1 applies unchanged.
#include <fmt/format.h>

#include "api/e2b/e2b.h"
#include "api/e2b/errors.h"
#include "api/requests.h"
#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/agent_client.h"
#include "service/sandbox_state.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;

// E2B's server default TTL when a create names none (its SDKs always send one).
constexpr int64_t kDefaultTimeoutS = 300;
// How long a create or wake may take before the request gives up (the SDKs wait 60 s).
constexpr std::chrono::seconds kStartWait{55};

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

absl::Status Unsupported(std::string_view field, std::string_view why) {
  return FieldError(field, why);
}

// E2B's state of an sbx sandbox: running and paused only (a sandbox being created, deleted or
// failed is not listed).
std::optional<std::string> E2bState(const std::string& state) {
  if (state == service::kRunning) return "running";
  if (state == service::kPaused || state == service::kSuspended) return "paused";
  return std::nullopt;
}

int64_t ResourceOf(const store::SandboxRecord& sb, const char* key) {
  const json& r = sb.effective_resources;
  if (r.is_object() && r.contains(key) && r[key].is_number_integer()) return r[key].get<int64_t>();
  return 0;
}

std::string EndAt(const store::SandboxRecord& sb) {
  auto created = ParseRfc3339(sb.created_at);
  if (!created) return sb.created_at;
  // No TTL: the end of E2B's longest (30 days), which no client mistakes for "soon".
  const int64_t ttl = sb.timeout_s.value_or(30LL * 86400);
  return FormatRfc3339(*created + std::chrono::seconds(ttl));
}

// ListedSandbox and SandboxDetail (e2b-compat.md §4.5).
json Listed(const store::SandboxRecord& sb) {
  json metadata = sb.labels.is_object() ? sb.labels : json::object();
  return json{{"sandboxID", E2bSandboxId(sb.id)},
              {"templateID", sb.template_ref},
              {"alias", sb.template_ref},
              {"clientID", "sbx"},
              {"startedAt", sb.created_at},
              {"endAt", EndAt(sb)},
              {"state", E2bState(sb.state).value_or("running")},
              {"cpuCount", ResourceOf(sb, "vcpu")},
              {"memoryMB", ResourceOf(sb, "memory_mib")},
              {"diskSizeMB", ResourceOf(sb, "disk_mib")},
              {"envdVersion", std::string(kEnvdVersion)},
              {"metadata", metadata}};
}

}  // namespace

std::string E2bSandboxId(std::string_view sbx_id) {
  std::string out(sbx_id);
  if (out.rfind("sbx_", 0) == 0) out[3] = '-';
  return out;
}

std::string SbxSandboxId(std::string_view e2b_id) {
  std::string out(e2b_id);
  if (out.rfind("sbx-", 0) == 0) out[3] = '_';
  return out;
}

absl::StatusOr<json> TranslateCreate(const json& in, const json& profiles) {
  json out = json::object();
  static const char* kKnown[] = {"templateID", "timeout", "metadata", "envVars",
                                 "allow_internet_access", "network", "secure", "autoPause",
                                 "autoResume", "mcp", "volumeMounts", "autoPauseMemory"};
  for (const auto& [k, v] : in.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown)) {
      return Unsupported(k, "unknown field");
    }
  }
  const json* tmpl = in.contains("templateID") ? &in["templateID"] : nullptr;
  if (tmpl == nullptr || !tmpl->is_string()) return FieldError("templateID", "must be a string");
  out["template"] = *tmpl;
  if (in.contains("timeout") && !in["timeout"].is_null()) {
    out["timeout_s"] = in["timeout"];
  } else {
    out["timeout_s"] = kDefaultTimeoutS;
  }
  if (in.contains("metadata") && !in["metadata"].is_null()) out["labels"] = in["metadata"];
  if (in.contains("envVars") && !in["envVars"].is_null()) out["env"] = in["envVars"];
  for (const char* k : {"mcp", "volumeMounts"}) {
    if (in.contains(k) && !in[k].is_null() && !(in[k].is_array() && in[k].empty()) &&
        !(in[k].is_object() && in[k].empty())) {
      return Unsupported(k, "not supported by sbx");
    }
  }
  for (const char* k : {"autoPause", "autoPauseMemory"}) {
    if (in.contains(k) && in[k].is_boolean() && in[k].get<bool>()) {
      return Unsupported(k, "sbx deletes a sandbox at its timeout; pausing instead is not "
                            "supported (pause it yourself before)");
    }
  }
  // Internet access: E2B's default is on. sbx gives the `open` egress profile when the
  // deployment has networking and the tenant may use it.
  bool has_open = false;
  if (profiles.is_object() && profiles.contains("egress_profiles")) {
    for (const json& p : profiles["egress_profiles"]) {
      if (p.is_object() && p.value("name", "") == "open") has_open = true;
    }
  }
  std::optional<bool> internet;
  if (in.contains("allow_internet_access") && !in["allow_internet_access"].is_null()) {
    if (!in["allow_internet_access"].is_boolean()) {
      return FieldError("allow_internet_access", "must be a boolean");
    }
    internet = in["allow_internet_access"].get<bool>();
  }
  if (in.contains("network") && !in["network"].is_null()) {
    const json& n = in["network"];
    if (!n.is_object()) return FieldError("network", "must be an object");
    for (const auto& [k, v] : n.items()) {
      if (k == "allowPublicTraffic") {
        if (!v.is_boolean()) return FieldError("network.allowPublicTraffic", "must be a boolean");
        out["public_ports"] = v.get<bool>();
      } else if (v.is_null() || (v.is_array() && v.empty())) {
        continue;
      } else {
        return Unsupported("network." + k, "not supported by sbx: egress is chosen by profile "
                                           "(allow_internet_access, docs/e2b.md)");
      }
    }
  }
  // The Python SDK sends `true` whatever its caller said, so a deployment (or tenant) without
  // `open` gives `none` rather than failing every default create; getInfo's
  // allowInternetAccess then says false, and docs/e2b.md says so.
  if (internet.value_or(true) && has_open) out["egress_profile"] = "open";
  return out;
}

Awaitable Gateway::WaitForRunning(Api& api, http::RequestContext& ctx,
                                  const service::Caller& caller, const std::string& op_id) {
  auto op = co_await api.WaitForOperation(ctx, caller, op_id, kStartWait);
  if (!op.ok()) co_return RestError(ctx, op.status(), Side::kControlPlane);
  if (op->state == "succeeded") co_return std::nullopt;
  if (op->state == "failed") {
    const json& e = op->error;
    const std::string code = e.is_object() ? e.value("code", std::string("internal")) : "internal";
    const std::string msg = e.is_object() ? e.value("message", std::string()) : std::string();
    const auto canonical = code == "insufficient_capacity" ? absl::StatusCode::kUnavailable
                                                           : absl::StatusCode::kInternal;
    co_return RestError(ctx, ApiError(canonical, code, fmt::format("sandbox {}: {}: {}",
                                                                   op->sandbox_id, code, msg)),
                        Side::kControlPlane);
  }
  co_return RestError(ctx,
                      ApiError(absl::StatusCode::kDeadlineExceeded, "deadline_exceeded",
                               fmt::format("sandbox {} is not running after {} s (operation {} "
                                           "is {})",
                                           op->sandbox_id, kStartWait.count(), op->id, op->state)),
                      Side::kControlPlane);
}

json E2bDefaultEnv(const store::SandboxRecord& sb) {
  return json{{"E2B_SANDBOX", "true"},
              {"E2B_SANDBOX_ID", E2bSandboxId(sb.id)},
              {"E2B_TEAM_ID", sb.tenant_id},
              {"E2B_TEMPLATE_ID", sb.template_ref}};
}

namespace {

// Writes kSharedEnvPath into a new sandbox whose template has a start process (docs/e2b.md,
// "The code interpreter"). Its failure is logged, not answered: the sandbox exists and works.
http::asio::awaitable<absl::Status> ShareEnv(Api& api, http::RequestContext& ctx,
                                       const service::Caller& caller, const std::string& id) {
  auto& svc = Gateway::Service(api);
  auto sb = log::With(ctx.log, [&] { return svc.GetSandbox(caller, id); });
  if (!sb.ok()) co_return sb.status();
  auto tmpl = svc.PinnedTemplate(*sb);
  if (!tmpl.ok() || tmpl->start_cmd.empty()) co_return absl::OkStatus();
  json env = E2bDefaultEnv(*sb);
  if (sb->env.is_object()) {
    for (const auto& [k, v] : sb->env.items()) env[k] = v;
  }
  auto agent = log::With(ctx.log, [&] { return svc.SandboxAgent(caller, id); });
  if (!agent.ok()) co_return agent.status();
  service::WriteRequest w;
  w.path = std::string(kSharedEnvPath);
  w.mode = 0644;
  w.mkdirs = true;
  auto up = co_await agent->Write(ctx.executor, std::move(w));
  if (!up.ok()) co_return up.status();
  const std::string bytes = env.dump();
  if (auto st = co_await up->Send(bytes); !st.ok()) co_return st;
  auto done = co_await up->Finish();
  co_return done.status();
}

}  // namespace

Awaitable Gateway::ControlPlane(Api& api, http::RequestContext& ctx, const Target& t,
                                const service::Caller& caller) {
  namespace sv = service;
  const http::Request& req = ctx.req;
  // The path without its "v2" (both versions answer in the same shapes).
  std::vector<std::string> seg = t.segments;
  const bool v2 = seg.front() == "v2";
  if (v2) seg.erase(seg.begin());
  const auto method = req.method();
  auto fail = [&](const absl::Status& s) { return RestError(ctx, s, Side::kControlPlane); };
  auto body = [&]() -> absl::StatusOr<json> {
    if (req.body().find_first_not_of(" \t\r\n") == std::string::npos) return json::object();
    auto j = ParseUntrustedJson(req.body());
    if (!j.ok()) return FieldError("body", std::string(j.status().message()));
    if (!j->is_object()) return FieldError("body", "must be a JSON object");
    return j;
  };
  auto need_scope = [&](sv::Scope s) -> absl::Status {
    if (sv::HasScope(caller.scopes, s) || sv::HasScope(caller.scopes, sv::Scope::kAdmin)) {
      return absl::OkStatus();
    }
    return ApiError(absl::StatusCode::kPermissionDenied, "missing_scope",
                    fmt::format("{} {} needs a token with the scope {}",
                                std::string(req.method_string()), t.path, sv::ScopeName(s)));
  };
  auto& svc = api.svc_;
  // The Sandbox answer of create, connect and resume.
  auto sandbox_answer = [&](const std::string& id, unsigned status) -> http::Response {
    auto sb = log::With(ctx.log, [&] { return svc.GetSandbox(caller, id); });
    if (!sb.ok()) return fail(sb.status());
    auto token = log::With(ctx.log, [&] { return svc.EnvdToken(caller, id); });
    if (!token.ok()) return fail(token.status());
    const std::string traffic =
        sb->port_access.is_object() ? sb->port_access.value("traffic_token", std::string()) : "";
    json out = {{"sandboxID", E2bSandboxId(id)},
                {"templateID", sb->template_ref},
                {"alias", sb->template_ref},
                {"clientID", "sbx"},
                {"envdVersion", std::string(kEnvdVersion)},
                {"envdAccessToken", *token},
                {"trafficAccessToken", traffic.empty() ? json(nullptr) : json(traffic)},
                {"domain", api.opts_.e2b_domain.empty() ? json(nullptr)
                                                        : json(api.opts_.e2b_domain)}};
    return RestJson(ctx, status, Dump(out));
  };

  // POST /sandboxes, POST /v2/sandboxes: create and wait until it is running.
  if (seg.size() == 1 && method == bhttp::verb::post) {
    if (auto s = need_scope(sv::Scope::kSandboxes); !s.ok()) co_return fail(s);
    auto in = body();
    if (!in.ok()) co_return fail(in.status());
    auto profiles = log::With(ctx.log, [&] { return svc.EgressProfiles(caller); });
    if (!profiles.ok()) co_return fail(profiles.status());
    auto translated = TranslateCreate(*in, *profiles);
    if (!translated.ok()) co_return fail(translated.status());
    auto parsed = ParseCreateSandbox(Dump(*translated), api.limits());
    if (!parsed.ok()) co_return fail(parsed.status());
    auto r = log::With(ctx.log, [&] { return svc.CreateSandbox(caller, *parsed, std::nullopt); });
    if (!r.ok()) co_return fail(r.status());
    const sv::SandboxCreated& created = *r->result;
    ctx.log.sandbox = created.sandbox.id;
    if (auto err = co_await WaitForRunning(api, ctx, caller, created.operation.id)) {
      co_return std::move(*err);
    }
    if (absl::Status st = co_await ShareEnv(api, ctx, caller, created.sandbox.id); !st.ok()) {
      SBX_LOG_WARN(ctx.log, "sandbox {}: {} not written, its start process lacks the env: {}",
                   created.sandbox.id, kSharedEnvPath, std::string(st.message()));
    }
    co_return sandbox_answer(created.sandbox.id, 201);
  }

  // GET /sandboxes (running ones), GET /v2/sandboxes (?state=running,paused&metadata=…).
  if (seg.size() == 1 && method == bhttp::verb::get) {
    if (auto s = need_scope(sv::Scope::kRead); !s.ok()) co_return fail(s);
    std::set<std::string> states = {"running"};
    if (v2) states.insert("paused");
    if (auto st = t.Query("state"); st && !st->empty()) {
      states.clear();
      for (std::string_view rest = *st; !rest.empty();) {
        const size_t comma = rest.find(',');
        std::string one(rest.substr(0, comma));
        if (one != "running" && one != "paused") {
          co_return fail(FieldError("state", "must be running, paused or both, comma-separated"));
        }
        states.insert(one);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    }
    // metadata: a query string of its own ("k=v&k2=v2"), each key and value percent-encoded
    // once more by the SDK (e2b-compat.md §4.5).
    std::map<std::string, std::string> want;
    if (auto md = t.Query("metadata"); md && !md->empty()) {
      auto inner = ParseTarget("/?" + *md);
      if (!inner.ok()) co_return fail(FieldError("metadata", "must be k=v pairs joined by &"));
      for (const auto& [k, v] : inner->query) {
        auto dk = PercentDecode(k, false), dv = PercentDecode(v, false);
        if (!dk || !dv) co_return fail(FieldError("metadata", "bad percent-encoding"));
        want[*dk] = *dv;
      }
    }
    int limit = 100;
    if (auto l = t.Query("limit")) {
      auto n = ParseLimit(l);
      if (!n.ok()) co_return fail(n.status());
      limit = *n;
    }
    store::SandboxFilter f;
    f.limit = limit;
    f.page_token = t.Query("nextToken").value_or("");
    if (!want.empty()) f.label = *want.begin();
    if (states.size() == 1 && states.count("running")) f.state = std::string(sv::kRunning);
    json list = json::array();
    std::optional<std::string> next;
    // Pages of the store hold states E2B does not list (creating, failed): read on until the
    // page is full or the store has no more, so an SDK paging by X-Next-Token sees them all.
    for (int round = 0; round < 20 && static_cast<int>(list.size()) < limit; ++round) {
      f.limit = limit - static_cast<int>(list.size());
      auto page = log::With(ctx.log, [&] { return svc.ListSandboxes(caller, f); });
      if (!page.ok()) co_return fail(page.status());
      for (const auto& sb : page->items) {
        auto st = E2bState(sb.state);
        if (!st || !states.count(*st)) continue;
        bool match = true;
        for (const auto& [k, v] : want) {
          if (!sb.labels.is_object() || !sb.labels.contains(k) || sb.labels[k] != v) match = false;
        }
        if (match) list.push_back(Listed(sb));
      }
      next = page->next_page_token;
      if (!next) break;
      f.page_token = *next;
    }
    http::Response res = RestJson(ctx, 200, Dump(list));
    if (next) res.set("X-Next-Token", *next);
    co_return res;
  }

  if (seg.size() < 2) {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("no route for {} {}", std::string(req.method_string()),
                                        t.path)));
  }
  const std::string id = SbxSandboxId(seg[1]);
  if (!IsValidId(id, "sbx")) {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("sandbox {} not found", id)));
  }
  ctx.log.sandbox = id;
  const std::string action = seg.size() > 2 ? seg[2] : std::string();
  if (seg.size() > 3) {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("no route for {}", t.path)));
  }

  if (action.empty() && method == bhttp::verb::get) {
    if (auto s = need_scope(sv::Scope::kRead); !s.ok()) co_return fail(s);
    auto sb = log::With(ctx.log, [&] { return svc.GetSandbox(caller, id); });
    if (!sb.ok()) co_return fail(sb.status());
    if (!E2bState(sb->state)) {
      co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                              fmt::format("sandbox {} is {}", id, sb->state)));
    }
    json out = Listed(*sb);
    auto token = log::With(ctx.log, [&] { return svc.EnvdToken(caller, id); });
    if (token.ok()) out["envdAccessToken"] = *token;
    out["domain"] = api.opts_.e2b_domain.empty() ? json(nullptr) : json(api.opts_.e2b_domain);
    out["allowInternetAccess"] = sb->egress_profile != "none" && !sb->egress_profile.empty();
    out["lifecycle"] = {{"onTimeout", "kill"}, {"autoResume", false}};
    co_return RestJson(ctx, 200, Dump(out));
  }

  if (action.empty() && method == bhttp::verb::delete_) {
    if (auto s = need_scope(sv::Scope::kSandboxes); !s.ok()) co_return fail(s);
    auto sb = log::With(ctx.log, [&] { return svc.GetSandbox(caller, id); });
    if (!sb.ok()) co_return fail(sb.status());
    if (sb->state == sv::kDeleted || sb->state == sv::kDeleting) {
      co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                              fmt::format("sandbox {} is {}", id, sb->state)));
    }
    auto r = log::With(ctx.log, [&] { return svc.DeleteSandbox(caller, id, std::nullopt); });
    if (!r.ok()) co_return fail(r.status());
    co_return RestEmpty(ctx, 204);
  }

  if (method != bhttp::verb::post ||
      (action != "timeout" && action != "refreshes" && action != "pause" &&
       action != "resume" && action != "connect")) {
    if (action == "metrics" || action == "logs" || action == "snapshots" || action == "fork" ||
        action == "network") {
      // An unknown sandbox first: its 404 is what the SDKs turn into NotFound.
      auto sb = log::With(ctx.log, [&] { return svc.GetSandbox(caller, id); });
      if (!sb.ok()) co_return fail(sb.status());
      if (!E2bState(sb->state)) {
        co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                                fmt::format("sandbox {} is {}", id, sb->state)));
      }
      co_return fail(ApiError(absl::StatusCode::kUnimplemented, "not_implemented",
                              fmt::format("{} of a sandbox is not supported by sbx (docs/e2b.md)",
                                          action)));
    }
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("no route for {} {}", std::string(req.method_string()),
                                        t.path)));
  }
  if (auto s = need_scope(sv::Scope::kSandboxes); !s.ok()) co_return fail(s);
  auto in = body();
  if (!in.ok()) co_return fail(in.status());
  // A TTL from now: `timeout` of timeout/connect/resume, `duration` of refreshes.
  auto seconds_of = [&](const char* key) -> absl::StatusOr<std::optional<int64_t>> {
    if (!in->contains(key) || (*in)[key].is_null()) return std::optional<int64_t>();
    if (!(*in)[key].is_number_integer()) return FieldError(key, "must be an integer (seconds)");
    return std::optional<int64_t>((*in)[key].get<int64_t>());
  };

  if (action == "timeout" || action == "refreshes") {
    auto s = seconds_of(action == "timeout" ? "timeout" : "duration");
    if (!s.ok()) co_return fail(s.status());
    // A refresh without a duration keeps it alive for E2B's default minute.
    const int64_t seconds = s->value_or(action == "refreshes" ? 60 : -1);
    if (seconds < 0) co_return fail(FieldError("timeout", "is required"));
    auto r = log::With(ctx.log, [&] { return svc.SetTimeoutFromNow(caller, id, seconds); });
    if (!r.ok()) co_return fail(r.status());
    co_return RestEmpty(ctx, 204);
  }

  auto sb = log::With(ctx.log, [&] { return svc.GetSandbox(caller, id); });
  if (!sb.ok()) co_return fail(sb.status());
  if (!E2bState(sb->state)) {
    co_return fail(ApiError(absl::StatusCode::kNotFound, "not_found",
                            fmt::format("sandbox {} is {}", id, sb->state)));
  }
  const bool paused = sb->state != sv::kRunning;

  if (action == "pause") {
    if (paused) {
      co_return fail(ApiError(absl::StatusCode::kAlreadyExists, "invalid_state",
                              fmt::format("sandbox {} is already paused", id)));
    }
    // E2B's pause keeps the sandbox for later at no cost: sbx's suspend (its memory on disk).
    auto r = log::With(ctx.log, [&] { return svc.RequestLifecycle(caller, id, "suspend", std::nullopt); });
    if (!r.ok()) co_return fail(r.status());
    if (auto err = co_await WaitForRunning(api, ctx, caller, r->result->operation.id)) {
      co_return std::move(*err);
    }
    co_return RestEmpty(ctx, 204);
  }

  // connect and resume: wake a paused sandbox, set its timeout if one is given.
  auto s = seconds_of("timeout");
  if (!s.ok()) co_return fail(s.status());
  if (action == "resume" && !paused) {
    co_return fail(ApiError(absl::StatusCode::kAlreadyExists, "invalid_state",
                            fmt::format("sandbox {} is already running", id)));
  }
  if (paused) {
    auto r = log::With(ctx.log, [&] { return svc.RequestLifecycle(caller, id, "wake", std::nullopt); });
    if (!r.ok()) co_return fail(r.status());
    if (auto err = co_await WaitForRunning(api, ctx, caller, r->result->operation.id)) {
      co_return std::move(*err);
    }
  }
  if (*s) {
    auto r = log::With(ctx.log, [&] { return svc.SetTimeoutFromNow(caller, id, **s); });
    if (!r.ok()) co_return fail(r.status());
  }
  co_return sandbox_answer(id, paused ? 201 : 200);
}

}  // namespace sbx::api::e2b
