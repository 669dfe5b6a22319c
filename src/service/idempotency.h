// Idempotency-Key on the routes whose service call does not record its own (docs/api.md,
// "Idempotency"): the router claims the key before the handler runs and records the answer
// after it. Create, delete, lifecycle and session creation keep theirs in the transaction that
// makes the change (service_internal.h); these others cannot, so a claim is a row with status 0
// ("in progress") that a concurrent duplicate waits on, then replays.
#pragma once

#include <chrono>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace sbx::service {

struct IdempotencyKey {
  std::string tenant_id, key, method, route;
  std::string body_hash;  // of what makes the request the same one (method, target, body)
};

struct Claimed {};                   // run the request, then FinishIdempotent
struct InProgress {};                // a duplicate runs now: wait, then claim again
struct Replay {                      // answer this, with Idempotent-Replayed: true
  int status = 0;
  std::string body;
};
using ClaimResult = std::variant<Claimed, InProgress, Replay>;

// 409 idempotency_key_reused when the key was used with another request. A claim older than
// `abandoned_after` (its sbxd died mid-request) is taken over.
absl::StatusOr<ClaimResult> ClaimIdempotent(store::Store& store, const IdempotencyKey& k,
                                            std::chrono::seconds abandoned_after);
// Records the answer (`status` >= 100, `body` JSON) for replays, or, for an answer that must
// not be replayed (a 5xx, a stream: status 0), gives the key back so a retry runs again.
absl::Status FinishIdempotent(store::Store& store, const IdempotencyKey& k, int status,
                              const std::string& body);

}  // namespace sbx::service
