#include "service/tenancy.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "common/time_util.h"
#include "service/mgmt_token.h"
#include "service/template_ref.h"

namespace sbx::service {

using nlohmann::json;
using store::TenantRecord;
using store::TokenRecord;
using store::Tx;

namespace {

absl::Status Unauthenticated(std::string_view why) {
  return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated", why);
}

absl::Status TenantNotFound(const std::string& id) {
  return ApiError(absl::StatusCode::kNotFound, "not_found",
                  fmt::format("tenant {:.64} not found", id));
}

absl::Status TokenNotFound(const std::string& id) {
  return ApiError(absl::StatusCode::kNotFound, "not_found",
                  fmt::format("token {:.64} not found", id));
}

}  // namespace

bool IsOperatorAdmin(const Caller& who) {
  return who.tenant_id == kOperatorTenant && HasScope(who.scopes, Scope::kAdmin);
}

std::string TemplateNamespaceOf(const Caller& who) {
  return who.tenant_id == kOperatorTenant ? std::string() : who.tenant_id;
}

absl::Status RequireOperatorAdmin(const Caller& who, std::string_view what) {
  if (IsOperatorAdmin(who)) return absl::OkStatus();
  return WithDetail(
      ApiError(absl::StatusCode::kPermissionDenied, "missing_scope",
               fmt::format("{} needs the admin scope of the operator tenant \"{}\"", what,
                           kOperatorTenant)),
      "scope", "admin");
}

namespace {

int64_t QuotaOf(const json& quotas, const char* key) {
  if (!quotas.is_object()) return -1;
  auto it = quotas.find(key);
  if (it == quotas.end() || !it->is_number_integer()) return -1;
  return it->get<int64_t>();
}

absl::Status Exceeded(const std::string& tenant, const char* quota, int64_t limit, int64_t used,
                      int64_t requested) {
  absl::Status s = ApiError(
      absl::StatusCode::kResourceExhausted, "quota_exceeded",
      fmt::format("tenant {} is at its quota {}: limit {}, in use {}, this request adds {}",
                  tenant, quota, limit, used, requested));
  s = WithDetail(std::move(s), "quota", quota);
  s = WithDetail(std::move(s), "limit", std::to_string(limit));
  s = WithDetail(std::move(s), "used", std::to_string(used));
  return WithDetail(std::move(s), "requested", std::to_string(requested));
}

}  // namespace

json TenantView(const TenantRecord& t) {
  return json{{"id", t.id},
              {"name", t.name},
              {"state", t.state},
              {"quotas", t.quotas.is_object() ? t.quotas : json::object()},
              {"rate_limit", t.rate_limit.is_object() ? t.rate_limit : json::object()},
              {"egress_profiles", t.egress_profiles.is_array() ? t.egress_profiles : json(nullptr)},
              {"created_at", t.created_at},
              {"updated_at", t.updated_at}};
}

json TokenView(const TokenRecord& t) {
  return json{{"id", t.id},
              {"tenant_id", t.tenant_id},
              {"name", t.name},
              {"scopes", t.scopes},
              {"expires_at", t.expires_at ? json(*t.expires_at) : json(nullptr)},
              {"created_at", t.created_at},
              {"revoked_at", t.revoked_at ? json(*t.revoked_at) : json(nullptr)}};
}

void Tenancy::SetOptions(const TenancyOptions& opts) {
  std::lock_guard lock(mu_);
  opts_ = opts;
}

TenancyOptions Tenancy::options() const {
  std::lock_guard lock(mu_);
  return opts_;
}

Principal Tenancy::Bootstrap() const {
  Principal p;
  p.caller.tenant_id = kOperatorTenant;
  p.caller.token_id = kBootstrapTokenId;
  p.caller.scopes = kAllScopes;
  // The operator's own token is never throttled: it is how a flood is stopped.
  return p;
}

absl::StatusOr<Principal> Tenancy::Authenticate(std::string_view token,
                                                std::chrono::system_clock::time_point now) const {
  SBX_ASSIGN_OR_RETURN(ParsedToken parsed, ParseToken(token));
  TokenRecord rec;
  TenantRecord tenant;
  absl::Status st = store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(rec, tx.GetToken(parsed.id));
    SBX_ASSIGN_OR_RETURN(tenant, tx.GetTenant(rec.tenant_id));
    return absl::OkStatus();
  });
  if (absl::IsNotFound(st)) return Unauthenticated("invalid token");
  SBX_RETURN_IF_ERROR(st);
  // The hash first: what follows must not tell a guesser that the id exists.
  if (!TokenMatches(token, rec.hash)) return Unauthenticated("invalid token");
  if (rec.revoked_at) return Unauthenticated("token revoked");
  if (rec.expires_at) {
    auto at = ParseRfc3339(*rec.expires_at);
    if (!at || now >= *at) return Unauthenticated("token expired");
  }
  if (tenant.state != "active") return Unauthenticated("the token's tenant is being deleted");
  std::vector<std::string> names;
  if (rec.scopes.is_array()) {
    for (const auto& s : rec.scopes) {
      if (s.is_string()) names.push_back(s.get<std::string>());
    }
  }
  auto scopes = ParseScopes(names);
  if (!scopes.ok()) return Unauthenticated("token has no valid scope");
  Principal p;
  p.caller.tenant_id = rec.tenant_id;
  p.caller.token_id = rec.id;
  p.caller.scopes = *scopes;
  const TenancyOptions o = options();
  p.rate_per_s = o.default_rate_per_s;
  p.burst = o.default_burst;
  if (tenant.rate_limit.is_object() && tenant.rate_limit.contains("requests_per_s")) {
    p.rate_per_s = tenant.rate_limit.value("requests_per_s", 0.0);
    p.burst = tenant.rate_limit.value("burst", uint64_t{0});
    if (p.burst == 0) p.burst = static_cast<uint64_t>(std::max(1.0, p.rate_per_s));
  }
  return p;
}

absl::StatusOr<TenantRecord> Tenancy::VisibleTenant(Tx& tx, const Caller& who,
                                                    const std::string& id) const {
  if (!IsOperatorAdmin(who) && id != who.tenant_id) return TenantNotFound(id);
  auto t = tx.GetTenant(id);
  if (absl::IsNotFound(t.status())) return TenantNotFound(id);
  return t;
}

absl::StatusOr<TokenRecord> Tenancy::VisibleToken(Tx& tx, const Caller& who,
                                                  const std::string& id) const {
  auto t = tx.GetToken(id);
  if (absl::IsNotFound(t.status())) return TokenNotFound(id);
  SBX_RETURN_IF_ERROR(t.status());
  // Another tenant's token looks missing; a failed read stays what it is (not a 404).
  if (auto v = VisibleTenant(tx, who, t->tenant_id); !v.ok()) {
    return absl::IsNotFound(v.status()) ? TokenNotFound(id) : v.status();
  }
  return t;
}

absl::StatusOr<json> Tenancy::CreateTenant(const Caller& who, const TenantSpec& spec) {
  SBX_RETURN_IF_ERROR(RequireOperatorAdmin(who, "creating a tenant"));
  TenantRecord t;
  t.id = NewId("ten");
  t.name = spec.name.value_or("");
  t.quotas = spec.quotas.value_or(json::object());
  t.rate_limit = spec.rate_limit.value_or(json::object());
  t.egress_profiles = spec.egress_profiles.value_or(json(nullptr));
  t.created_at = t.updated_at = NowRfc3339();
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) { return tx.PutTenant(t); }));
  spdlog::info("tenant {} ({}) created", t.id, t.name);
  return json{{"tenant", TenantView(t)}};
}

absl::StatusOr<json> Tenancy::ListTenants(const Caller& who) {
  SBX_RETURN_IF_ERROR(FinishDeletions().status());
  json out = json::array();
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    out = json::array();
    SBX_ASSIGN_OR_RETURN(std::vector<TenantRecord> all, tx.ListTenants());
    for (const auto& t : all) {
      if (IsOperatorAdmin(who) || t.id == who.tenant_id) out.push_back(TenantView(t));
    }
    return absl::OkStatus();
  }));
  return json{{"tenants", out}, {"next_page_token", nullptr}};
}

absl::StatusOr<json> Tenancy::GetTenant(const Caller& who, const std::string& id) {
  SBX_RETURN_IF_ERROR(FinishDeletions().status());
  json out;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(TenantRecord t, VisibleTenant(tx, who, id));
    SBX_ASSIGN_OR_RETURN(store::TenantUsage u, tx.GetTenantUsage(id));
    out = TenantView(t);
    Caller owner;
    owner.tenant_id = id;
    SBX_ASSIGN_OR_RETURN(TemplateUsage tu, ReadTemplateUsage(tx, TemplateNamespaceOf(owner)));
    out["usage"] = {{"sandboxes", u.sandboxes},   {"vcpu", u.vcpu},
                    {"memory_mib", u.memory_mib}, {"disk_mib", u.disk_mib},
                    {"templates", tu.names},      {"template_bytes", tu.bytes}};
    return absl::OkStatus();
  }));
  return json{{"tenant", out}};
}

absl::StatusOr<json> Tenancy::UpdateTenant(const Caller& who, const std::string& id,
                                           const TenantSpec& spec) {
  TenantRecord t;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(t, VisibleTenant(tx, who, id));
    // Seeing one's own tenant is not changing its quotas.
    SBX_RETURN_IF_ERROR(RequireOperatorAdmin(who, "changing a tenant"));
    if (t.state != "active") {
      return ApiError(absl::StatusCode::kFailedPrecondition, "tenant_deleting",
                      fmt::format("tenant {} is being deleted", id));
    }
    if (spec.name) t.name = *spec.name;
    if (spec.quotas) t.quotas = *spec.quotas;
    if (spec.rate_limit) t.rate_limit = *spec.rate_limit;
    if (spec.egress_profiles) t.egress_profiles = *spec.egress_profiles;
    t.updated_at = NowRfc3339();
    return tx.PutTenant(t);
  }));
  return json{{"tenant", TenantView(t)}};
}

absl::StatusOr<std::vector<std::string>> Tenancy::BeginDeleteTenant(const Caller& who,
                                                                    const std::string& id) {
  std::vector<std::string> live;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    live.clear();
    SBX_ASSIGN_OR_RETURN(TenantRecord t, VisibleTenant(tx, who, id));
    SBX_RETURN_IF_ERROR(RequireOperatorAdmin(who, "deleting a tenant"));
    if (id == kOperatorTenant) {
      return ApiError(absl::StatusCode::kFailedPrecondition, "failed_precondition",
                      "the operator tenant \"default\" cannot be deleted");
    }
    t.state = "deleting";
    t.updated_at = NowRfc3339();
    SBX_RETURN_IF_ERROR(tx.PutTenant(t));
    store::SandboxFilter f;
    f.tenant_id = id;
    f.limit = 500;
    for (;;) {
      SBX_ASSIGN_OR_RETURN(auto page, tx.ListSandboxes(f));
      for (const auto& sb : page.items) {
        if (sb.state != "deleted") live.push_back(sb.id);
      }
      if (!page.next_page_token) break;
      f.page_token = *page.next_page_token;
    }
    return absl::OkStatus();
  }));
  spdlog::info("tenant {} is being deleted: {} sandbox(es) to delete", id, live.size());
  return live;
}

absl::StatusOr<int> Tenancy::FinishDeletions() {
  int removed = 0;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    removed = 0;
    SBX_ASSIGN_OR_RETURN(std::vector<TenantRecord> all, tx.ListTenants());
    for (const auto& t : all) {
      if (t.state != "deleting") continue;
      SBX_ASSIGN_OR_RETURN(store::TenantUsage u, tx.GetTenantUsage(t.id));
      if (u.sandboxes > 0) continue;
      SBX_RETURN_IF_ERROR(tx.DeleteTenant(t.id));
      ++removed;
    }
    return absl::OkStatus();
  }));
  return removed;
}

absl::StatusOr<json> Tenancy::CreateToken(const Caller& who, const std::string& tenant_id,
                                          const TokenSpec& spec) {
  SBX_ASSIGN_OR_RETURN(Scopes scopes, ParseScopes(spec.scopes));
  // No token can give more than its maker holds.
  for (uint32_t bit = 1; bit != 0 && bit <= kAllScopes; bit <<= 1) {
    if ((scopes & bit) != 0 && !HasScope(who.scopes, static_cast<Scope>(bit))) {
      return ApiError(absl::StatusCode::kPermissionDenied, "missing_scope",
                      fmt::format("a token cannot grant the scope {} it does not hold",
                                  ScopeName(static_cast<Scope>(bit))),
                      "scopes");
    }
  }
  const TenancyOptions o = options();
  if (spec.expires_in_s && o.max_token_ttl_s > 0 && *spec.expires_in_s > o.max_token_ttl_s) {
    return FieldError("expires_in_s", fmt::format("at most {} (tenancy.max_token_ttl_s)",
                                                  o.max_token_ttl_s));
  }
  MintedToken minted = MintToken();
  TokenRecord rec;
  rec.id = minted.id;
  rec.tenant_id = tenant_id;
  rec.name = spec.name;
  rec.hash = minted.hash;
  rec.scopes = ScopeNames(scopes);
  const auto now = std::chrono::system_clock::now();
  rec.created_at = FormatRfc3339(now);
  if (spec.expires_in_s) {
    rec.expires_at = FormatRfc3339(now + std::chrono::seconds(*spec.expires_in_s));
  }
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(TenantRecord t, VisibleTenant(tx, who, tenant_id));
    if (t.state != "active") {
      return ApiError(absl::StatusCode::kFailedPrecondition, "tenant_deleting",
                      fmt::format("tenant {} is being deleted", tenant_id));
    }
    return tx.PutToken(rec);
  }));
  json out = TokenView(rec);
  // Shown once: only its hash is kept.
  out["token"] = minted.token;
  return json{{"token", out}};
}

absl::StatusOr<json> Tenancy::ListTokens(const Caller& who, const std::string& tenant_id) {
  json out = json::array();
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    out = json::array();
    SBX_RETURN_IF_ERROR(VisibleTenant(tx, who, tenant_id).status());
    SBX_ASSIGN_OR_RETURN(std::vector<TokenRecord> all, tx.ListTokens(tenant_id));
    for (const auto& t : all) out.push_back(TokenView(t));
    return absl::OkStatus();
  }));
  return json{{"tokens", out}, {"next_page_token", nullptr}};
}

absl::StatusOr<json> Tenancy::GetToken(const Caller& who, const std::string& token_id) {
  TokenRecord rec;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(rec, VisibleToken(tx, who, token_id));
    return absl::OkStatus();
  }));
  return json{{"token", TokenView(rec)}};
}

absl::StatusOr<json> Tenancy::RevokeToken(const Caller& who, const std::string& token_id) {
  TokenRecord rec;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    SBX_ASSIGN_OR_RETURN(rec, VisibleToken(tx, who, token_id));
    if (!rec.revoked_at) {  // revoking twice keeps the first time
      rec.revoked_at = NowRfc3339();
      SBX_RETURN_IF_ERROR(tx.PutToken(rec));
    }
    return absl::OkStatus();
  }));
  spdlog::info("token {} of tenant {} revoked", rec.id, rec.tenant_id);
  return json{{"token", TokenView(rec)}};
}

void Tenancy::Audit(store::AuditRecord rec) {
  if (rec.time.empty()) rec.time = NowRfc3339();
  audit_.Add(std::move(rec));
}

absl::StatusOr<json> Tenancy::ListAudit(const Caller& who, const store::AuditFilter& filter) {
  audit_.Flush();  // this process's lines so far are in the listing
  store::AuditFilter f = filter;
  if (!IsOperatorAdmin(who)) {
    if (f.tenant_id && *f.tenant_id != who.tenant_id) return TenantNotFound(*f.tenant_id);
    f.tenant_id = who.tenant_id;
  }
  json rows = json::array();
  int64_t last = f.after_seq;
  SBX_RETURN_IF_ERROR(store_.Transact([&](Tx& tx) -> absl::Status {
    rows = json::array();
    last = f.after_seq;
    SBX_ASSIGN_OR_RETURN(std::vector<store::AuditRecord> got, tx.ListAudit(f));
    for (const auto& r : got) {
      rows.push_back({{"seq", r.seq},
                      {"time", r.time},
                      {"tenant_id", r.tenant_id},
                      {"token_id", r.token_id},
                      {"action", r.action},
                      {"target", r.target},
                      {"status", r.status},
                      {"code", r.code},
                      {"request_id", r.request_id}});
      last = r.seq;
    }
    return absl::OkStatus();
  }));
  const bool more = static_cast<int>(rows.size()) == f.limit;
  return json{{"audit", rows},
              {"next_page_token", more ? json(std::to_string(last)) : json(nullptr)}};
}

absl::StatusOr<std::optional<store::TenantRecord>> FindTenant(Tx& tx,
                                                              const std::string& tenant_id) {
  auto t = tx.GetTenant(tenant_id);
  if (absl::IsNotFound(t.status())) return std::optional<store::TenantRecord>();
  SBX_RETURN_IF_ERROR(t.status());
  return std::optional<store::TenantRecord>(std::move(*t));
}

absl::Status CheckSandboxQuota(Tx& tx, const std::string& tenant_id,
                               const runtime::Resources& adding, bool new_sandbox) {
  SBX_ASSIGN_OR_RETURN(std::optional<store::TenantRecord> t, FindTenant(tx, tenant_id));
  return CheckSandboxQuota(tx, t, adding, new_sandbox);
}

absl::Status CheckSandboxQuota(Tx& tx, const std::optional<store::TenantRecord>& t,
                               const runtime::Resources& adding, bool new_sandbox) {
  if (!t) return absl::OkStatus();  // no row: no quotas
  const std::string& tenant_id = t->id;
  if (t->state != "active") {
    return ApiError(absl::StatusCode::kFailedPrecondition, "tenant_deleting",
                    fmt::format("tenant {} is being deleted: it takes no new work", tenant_id));
  }
  const json& q = t->quotas;
  if (!q.is_object() || q.empty()) return absl::OkStatus();
  SBX_ASSIGN_OR_RETURN(store::TenantUsage u, tx.GetTenantUsage(tenant_id));
  struct Row {
    const char* quota;
    int64_t used, add;
  };
  const Row rows[] = {
      {"max_sandboxes", u.sandboxes, new_sandbox ? 1 : 0},
      {"max_vcpu", u.vcpu, adding.vcpu},
      {"max_memory_mib", u.memory_mib, adding.memory_mib},
      {"max_disk_mib", u.disk_mib, adding.disk_mib},
  };
  for (const Row& r : rows) {
    const int64_t limit = QuotaOf(q, r.quota);
    if (limit >= 0 && r.add > 0 && r.used + r.add > limit) {
      return Exceeded(tenant_id, r.quota, limit, r.used, r.add);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTemplateQuota(Tx& tx, const std::string& tenant_id, const TemplateUsage& now,
                                const TemplateUsage& after) {
  auto t = tx.GetTenant(tenant_id);
  if (absl::IsNotFound(t.status())) {
    // Its row went while an import ran: what it made must not outlive the tenant.
    return ApiError(absl::StatusCode::kFailedPrecondition, "tenant_deleting",
                    fmt::format("tenant {} has been deleted", tenant_id));
  }
  SBX_RETURN_IF_ERROR(t.status());
  if (t->state != "active") {
    return ApiError(absl::StatusCode::kFailedPrecondition, "tenant_deleting",
                    fmt::format("tenant {} is being deleted: it takes no new work", tenant_id));
  }
  struct Row {
    const char* quota;
    int64_t used, next;
  };
  const Row rows[] = {{"max_templates", now.names, after.names},
                      {"max_template_bytes", now.bytes, after.bytes}};
  for (const Row& r : rows) {
    const int64_t limit = QuotaOf(t->quotas, r.quota);
    // Only growth is refused: a tenant over a quota lowered meanwhile may still shrink.
    if (limit >= 0 && r.next > r.used && r.next > limit) {
      return Exceeded(tenant_id, r.quota, limit, r.used, r.next - r.used);
    }
  }
  return absl::OkStatus();
}

TemplateUsage UsageOfNamespace(const std::string& ns, const std::vector<store::TagRecord>& tags,
                               const std::optional<store::TagRecord>& change,
                               const std::function<int64_t(const std::string&)>& size_of) {
  std::set<std::string> names, digests;
  auto count = [&](const store::TagRecord& t) {
    if (SplitTemplateName(t.name).ns != ns) return;
    names.insert(t.name);
    digests.insert(t.digest);
  };
  for (const store::TagRecord& t : tags) {
    if (!change || t.name != change->name || t.tag != change->tag) count(t);
  }
  if (change) count(*change);
  TemplateUsage u;
  u.names = static_cast<int64_t>(names.size());
  for (const std::string& d : digests) u.bytes += size_of(d);
  return u;
}

absl::StatusOr<TemplateUsage> ReadTemplateUsage(Tx& tx, const std::string& ns) {
  SBX_ASSIGN_OR_RETURN(std::vector<store::TagRecord> tags, tx.ListTags());
  SBX_ASSIGN_OR_RETURN(std::vector<store::ImageRecord> images, tx.ListImages());
  std::map<std::string, int64_t> sizes;
  for (const store::ImageRecord& i : images) sizes[i.digest] = i.size;
  return UsageOfNamespace(ns, tags, std::nullopt, [&](const std::string& d) {
    auto it = sizes.find(d);
    return it == sizes.end() ? int64_t{0} : it->second;
  });
}

namespace {

std::optional<std::set<std::string>> ProfilesOf(const std::optional<store::TenantRecord>& t) {
  if (!t || !t->egress_profiles.is_array()) return std::nullopt;
  std::set<std::string> names = {"none"};
  for (const json& n : t->egress_profiles) {
    if (n.is_string()) names.insert(n.get<std::string>());
  }
  return names;
}

}  // namespace

absl::StatusOr<std::optional<std::set<std::string>>> AllowedEgressProfiles(
    Tx& tx, const std::string& tenant_id) {
  SBX_ASSIGN_OR_RETURN(std::optional<store::TenantRecord> t, FindTenant(tx, tenant_id));
  return ProfilesOf(t);
}

absl::Status CheckEgressProfile(Tx& tx, const std::string& tenant_id, const std::string& profile) {
  SBX_ASSIGN_OR_RETURN(std::optional<store::TenantRecord> t, FindTenant(tx, tenant_id));
  return CheckEgressProfile(t, profile);
}

absl::Status CheckEgressProfile(const std::optional<store::TenantRecord>& tenant,
                                const std::string& profile) {
  const std::optional<std::set<std::string>> allowed = ProfilesOf(tenant);
  if (!allowed || allowed->count(profile)) return absl::OkStatus();
  // As for a profile the deployment does not have: to the tenant, it does not exist.
  std::string names;
  for (const std::string& n : *allowed) names += (names.empty() ? "" : ", ") + n;
  return FieldError("egress_profile",
                    fmt::format("unknown profile '{:.64}' (available: {})", profile, names));
}

absl::Status CheckSessionQuota(Tx& tx, const std::optional<store::TenantRecord>& tenant,
                               const std::string& sandbox_id) {
  if (!tenant) return absl::OkStatus();
  const int64_t limit = QuotaOf(tenant->quotas, "max_sessions_per_sandbox");
  if (limit < 0) return absl::OkStatus();
  SBX_ASSIGN_OR_RETURN(int64_t live, tx.CountLiveSessions(sandbox_id));
  if (live + 1 > limit) return Exceeded(tenant->id, "max_sessions_per_sandbox", limit, live, 1);
  return absl::OkStatus();
}

}  // namespace sbx::service
