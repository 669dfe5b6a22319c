// Idempotency-Key on the routes whose service call does not record its own (docs/api.md,
// "Idempotency"): the router claims the key before the handler runs and records the answer
// after it. Create, delete, lifecycle and session creation keep theirs in the transaction that
// makes the change (service_internal.h); these others cannot, so a claim is a row with status 0
// ("in progress") that a concurrent duplicate waits on, then replays.
//
// A request whose body streams (an upload) is claimed before its body is read: its hash is
// known only once the handler has read the body (then FinishIdempotent records it), and a
// duplicate learns it only by reading its own body, after the claim said what the first was.
#pragma once

#include <chrono>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace sbx::service {

struct IdempotencyKey {
  std::string tenant_id, key, method, route;
  // Of what makes the request the same one (method, target, body); empty while the body of a
  // streamed request is unread: the claim then compares nothing and leaves it to the caller
  // (Replay::body_hash).
  std::string body_hash;
};

struct Claimed {};                   // run the request, then FinishIdempotent
struct InProgress {};                // a duplicate runs now: wait, then claim again
struct Replay {                      // answer this, with Idempotent-Replayed: true
  int status = 0;
  std::string body;
  std::string body_hash;  // the first request's, for a caller whose own hash was not known yet
};
using ClaimResult = std::variant<Claimed, InProgress, Replay>;

// 409 idempotency_key_reused: the key was used with another request.
absl::Status KeyReusedError();

// KeyReusedError when the key was used with another request (both hashes known). A claim
// older than `abandoned_after` (its sbxd died mid-request) is taken over.
absl::StatusOr<ClaimResult> ClaimIdempotent(store::Store& store, const IdempotencyKey& k,
                                            std::chrono::seconds abandoned_after);
// Records the answer (`status` >= 100, `body` JSON) for replays, or, for an answer that must
// not be replayed (a 5xx, a stream: status 0) or one to a request whose hash is not known (a
// streamed body the handler did not read to its end), gives the key back so a retry runs
// again.
absl::Status FinishIdempotent(store::Store& store, const IdempotencyKey& k, int status,
                              const std::string& body);

}  // namespace sbx::service
