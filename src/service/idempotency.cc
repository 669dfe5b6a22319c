#include "service/idempotency.h"

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/time_util.h"

namespace sbx::service {
namespace {

// A key given back (status -1) or never claimed is free; 0 is a claim in progress.
constexpr int kInProgress = 0;
constexpr int kReleased = -1;

}  // namespace

absl::Status KeyReusedError() {
  return ApiError(absl::StatusCode::kFailedPrecondition, "idempotency_key_reused",
                  "Idempotency-Key was already used with a different request");
}

absl::StatusOr<ClaimResult> ClaimIdempotent(store::Store& store, const IdempotencyKey& k,
                                            std::chrono::seconds abandoned_after) {
  ClaimResult out = Claimed{};
  const auto now = std::chrono::system_clock::now();
  SBX_RETURN_IF_ERROR(store.Transact([&](store::Tx& tx) -> absl::Status {
    out = Claimed{};
    SBX_ASSIGN_OR_RETURN(auto rec, tx.GetIdempotency(k.tenant_id, k.key, k.method, k.route));
    if (rec && rec->status != kReleased) {
      // A streamed request's hash is empty until its body has been read, both in its claim
      // and in a duplicate's key.
      if (!k.body_hash.empty() && !rec->body_hash.empty() && rec->body_hash != k.body_hash) {
        return KeyReusedError();
      }
      if (rec->status != kInProgress) {
        out = Replay{rec->status, rec->response_body, rec->body_hash};
        return absl::OkStatus();
      }
      auto since = ParseRfc3339(rec->created_at);
      if (since && now - *since < abandoned_after) {
        out = InProgress{};
        return absl::OkStatus();
      }
    }
    store::IdempotencyRecord claim;
    claim.tenant_id = k.tenant_id;
    claim.key = k.key;
    claim.method = k.method;
    claim.route = k.route;
    claim.body_hash = k.body_hash;
    claim.status = kInProgress;
    claim.created_at = FormatRfc3339(now);
    return tx.PutIdempotency(claim);
  }));
  return out;
}

absl::Status FinishIdempotent(store::Store& store, const IdempotencyKey& k, int status,
                              const std::string& body) {
  store::IdempotencyRecord rec;
  rec.tenant_id = k.tenant_id;
  rec.key = k.key;
  rec.method = k.method;
  rec.route = k.route;
  rec.body_hash = k.body_hash;
  const bool keep = status >= 100 && status < 500 && !k.body_hash.empty();
  rec.status = keep ? status : kReleased;
  rec.response_body = keep ? body : "";
  rec.created_at = NowRfc3339();
  return store.Transact([&](store::Tx& tx) { return tx.PutIdempotency(rec); });
}

}  // namespace sbx::service
