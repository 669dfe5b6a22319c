// The store's statement timers, shared by both backends so that a dashboard reads the same
// series whichever database is behind sbxd. Internal to the store.
#pragma once

#include <array>
#include <iterator>
#include <string_view>

#include "common/metrics.h"

namespace sbx::store {

// What sbx_store_query_duration_seconds{op} distinguishes: the Tx methods, BEGIN and COMMIT.
enum class QueryOp {
  kBegin,
  kCommit,
  kGetSandbox,
  kListSandboxes,
  kListLiveSandboxes,
  kCountLiveSandboxesByState,
  kPutSandbox,
  kGetOperation,
  kPutOperation,
  kListOperations,
  kListUnfinishedOperations,
  kGetSession,
  kPutSession,
  kListSessions,
  kGetIdempotency,
  kPutIdempotency,
  kPurgeIdempotency,
  kPurgeDeletedSandboxes,
  kTemplates,
  kTenants,
  kGetToken,
  kAppendAudit,
  kListAudit,
  kGetTenantUsage,
  kCountLiveSessions,
  kNodes,
  kCount,
};
inline constexpr std::string_view kQueryOpNames[] = {
    "Begin", "Commit", "GetSandbox", "ListSandboxes", "ListLiveSandboxes",
    "CountLiveSandboxesByState", "PutSandbox", "GetOperation", "PutOperation", "ListOperations",
    "ListUnfinishedOperations", "GetSession", "PutSession", "ListSessions", "GetIdempotency",
    "PutIdempotency", "PurgeIdempotency", "PurgeDeletedSandboxes", "Templates", "Tenants",
    "GetToken", "AppendAudit", "ListAudit", "GetTenantUsage", "CountLiveSessions", "Nodes",
};
static_assert(std::size(kQueryOpNames) == static_cast<size_t>(QueryOp::kCount));

// sbx_store_query_duration_seconds{op}, one histogram per QueryOp.
class QueryTimers {
 public:
  explicit QueryTimers(metrics::Registry& registry) {
    // Most statements take tens of microseconds; the top buckets catch busy waits and fsyncs.
    auto& family = registry.AddHistogram(
        "sbx_store_query_duration_seconds",
        "Time of one store statement (op: the store method, or Begin/Commit of a transaction; on "
        "PostgreSQL the round trip that carried the BEGIN or the COMMIT).",
        {"op"},
        {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
         1, 5});
    for (size_t i = 0; i < timers_.size(); ++i) timers_[i] = &family.WithLabels({kQueryOpNames[i]});
  }
  metrics::Histogram& operator[](QueryOp op) const { return *timers_[static_cast<size_t>(op)]; }

 private:
  std::array<metrics::Histogram*, static_cast<size_t>(QueryOp::kCount)> timers_{};
};

}  // namespace sbx::store
