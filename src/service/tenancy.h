// Tenants, their management tokens, their quotas and the audit log (docs/tenancy.md).
//
// A management token ("sbxm1_…", service/mgmt_token.h) is looked up by the id it carries and
// compared by hash in constant time on every request, so a revocation, an expiry or a tenant's
// deletion takes effect on the next request, also on another sbxd sharing the store. The
// configured admin token (api.admin_token) is the bootstrap admin of tenant `default`, the
// operator's tenant: only its admin scope (and that of other `default` tokens) reaches every
// tenant; a token of another tenant with the admin scope manages its own tenant's tokens and
// reads its own audit rows. Another tenant's tenant or token is 404, as every object is.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "runtime/backend.h"
#include "service/audit_writer.h"
#include "service/inputs.h"
#include "service/mgmt_token.h"
#include "store/store.h"

namespace sbx::service {

inline constexpr char kOperatorTenant[] = "default";
inline constexpr char kBootstrapTokenId[] = "bootstrap";

// The deployment's own administrator: a token with the admin scope of the operator tenant. Only
// it reaches what belongs to the deployment rather than to one tenant (tenants, the attach keys,
// /metrics, the admission reserve, shared templates).
bool IsOperatorAdmin(const Caller& who);
// OK for the operator's admin; otherwise 403 missing_scope (detail scope=admin) saying that
// `what` needs it.
absl::Status RequireOperatorAdmin(const Caller& who, std::string_view what);
// The template namespace of `who` (template_ref.h): "" (the shared catalogue) for the operator
// tenant, the tenant's id for any other.
std::string TemplateNamespaceOf(const Caller& who);

// Who a management token is, and how fast it may go.
struct Principal {
  Caller caller;
  double rate_per_s = 0;  // 0: unlimited
  uint64_t burst = 0;
};

struct TenancyOptions {
  // Per token of a tenant without its own rate_limit (tenancy.rate_limit_rps, _burst).
  double default_rate_per_s = 0;
  uint64_t default_burst = 0;
  // Longest expires_in_s a token may ask for (0: no bound).
  int64_t max_token_ttl_s = 0;
};

class Tenancy {
 public:
  Tenancy(store::Store& store, TenancyOptions opts) : store_(store), opts_(std::move(opts)) {}

  void SetOptions(const TenancyOptions& opts);
  TenancyOptions options() const;

  // A management token of the store: Unauthenticated (401) when malformed, unknown, revoked,
  // expired or of a tenant being deleted. One primary-key read.
  absl::StatusOr<Principal> Authenticate(std::string_view token,
                                         std::chrono::system_clock::time_point now) const;
  // The bootstrap admin (the configured admin token), with the deployment's default rate.
  Principal Bootstrap() const;

  // Admin API. `who` must hold the admin scope (the router checks); tenant-wide calls need
  // the operator tenant's.
  absl::StatusOr<nlohmann::json> CreateTenant(const Caller& who, const TenantSpec& spec);
  absl::StatusOr<nlohmann::json> ListTenants(const Caller& who);
  absl::StatusOr<nlohmann::json> GetTenant(const Caller& who, const std::string& id);
  absl::StatusOr<nlohmann::json> UpdateTenant(const Caller& who, const std::string& id,
                                              const TenantSpec& spec);
  // Marks the tenant `deleting` (its tokens stop working at once) and returns its live
  // sandboxes, which the caller deletes as operations. The row goes once they are gone
  // (FinishDeletions). The operator tenant cannot be deleted.
  absl::StatusOr<std::vector<std::string>> BeginDeleteTenant(const Caller& who,
                                                             const std::string& id);
  // Removes the rows of deleting tenants without live sandboxes; returns how many.
  absl::StatusOr<int> FinishDeletions();

  absl::StatusOr<nlohmann::json> CreateToken(const Caller& who, const std::string& tenant_id,
                                             const TokenSpec& spec);
  absl::StatusOr<nlohmann::json> ListTokens(const Caller& who, const std::string& tenant_id);
  absl::StatusOr<nlohmann::json> GetToken(const Caller& who, const std::string& token_id);
  absl::StatusOr<nlohmann::json> RevokeToken(const Caller& who, const std::string& token_id);

  // Appends one row; never fails the request it describes (a store error is logged). The row
  // also goes to the JSON log. Written by AuditWriter's thread, after the answer; ListAudit
  // waits for this process's rows so far.
  void Audit(store::AuditRecord rec);
  absl::StatusOr<nlohmann::json> ListAudit(const Caller& who, const store::AuditFilter& filter);

 private:
  // The tenant `who` may see: its own, or any for the operator tenant's admin; 404 otherwise.
  absl::StatusOr<store::TenantRecord> VisibleTenant(store::Tx& tx, const Caller& who,
                                                    const std::string& id) const;
  // A token of a tenant `who` may see; 404 otherwise.
  absl::StatusOr<store::TokenRecord> VisibleToken(store::Tx& tx, const Caller& who,
                                                  const std::string& id) const;

  store::Store& store_;
  mutable std::mutex mu_;
  TenancyOptions opts_;
  AuditWriter audit_{store_};  // last: destroyed (and drained) first
};

// Quotas (docs/tenancy.md, "Quotas"), checked inside the transaction that records the change,
// so that concurrent requests can never pass a limit together: 429 quota_exceeded naming the
// quota, its limit and the tenant's current use.
//  - a new sandbox (`new_sandbox`) or a suspended one waking, holding `adding`;
absl::Status CheckSandboxQuota(store::Tx& tx, const std::string& tenant_id,
                               const runtime::Resources& adding, bool new_sandbox);
// The same with the tenant's row already read (FindTenant), for a request that checks more
// than one thing of it: each read is a round trip to PostgreSQL.
absl::Status CheckSandboxQuota(store::Tx& tx, const std::optional<store::TenantRecord>& tenant,
                               const runtime::Resources& adding, bool new_sandbox);
// The tenant's row, or none (a token of no tenant row: no quotas, every profile).
absl::StatusOr<std::optional<store::TenantRecord>> FindTenant(store::Tx& tx,
                                                              const std::string& tenant_id);
//  - a new session of `sandbox_id`, with its tenant's row already read (nullopt: none).
absl::Status CheckSessionQuota(store::Tx& tx, const std::optional<store::TenantRecord>& tenant,
                               const std::string& sandbox_id);

//  - a tenant's own templates: the distinct names its tags use and the unpacked bytes of the
//    distinct releases they name, as they are (`now`) and as the change would make them
//    (`after`). A tenant being deleted takes no new template either.
struct TemplateUsage {
  int64_t names = 0;
  int64_t bytes = 0;
};
absl::Status CheckTemplateQuota(store::Tx& tx, const std::string& tenant_id,
                                const TemplateUsage& now, const TemplateUsage& after);
// What the tags of template namespace `ns` hold, with `change` (a tag put, replacing the one of
// its name and tag) applied when given; `size_of` gives a release's unpacked bytes by digest.
TemplateUsage UsageOfNamespace(const std::string& ns, const std::vector<store::TagRecord>& tags,
                               const std::optional<store::TagRecord>& change,
                               const std::function<int64_t(const std::string&)>& size_of);
// The same, read in `tx`.
absl::StatusOr<TemplateUsage> ReadTemplateUsage(store::Tx& tx, const std::string& ns);

// Egress profiles per tenant: the names a tenant may use (`none` always among them), or nullopt
// for every profile of the deployment (no list, or no row).
absl::StatusOr<std::optional<std::set<std::string>>> AllowedEgressProfiles(
    store::Tx& tx, const std::string& tenant_id);
// 400 on field egress_profile, worded as for a profile the deployment lacks, when the tenant
// may not use `profile`.
absl::Status CheckEgressProfile(store::Tx& tx, const std::string& tenant_id,
                                const std::string& profile);
absl::Status CheckEgressProfile(const std::optional<store::TenantRecord>& tenant,
                                const std::string& profile);

// The JSON form of a tenant and of a token (never its secret or hash).
nlohmann::json TenantView(const store::TenantRecord& t);
nlohmann::json TokenView(const store::TokenRecord& t);

}  // namespace sbx::service
