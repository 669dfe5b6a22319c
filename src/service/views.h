// Record -> API JSON. One function per resource, used by handlers and by the idempotency
// records (which store the exact first response).
#pragma once

#include <nlohmann/json.hpp>

#include "store/store.h"

namespace sbx::service {

// created_at + timeout_s (RFC 3339), or null without a TTL.
nlohmann::json ExpiresAt(const store::SandboxRecord& r);
nlohmann::json SandboxView(const store::SandboxRecord& r);
nlohmann::json OperationView(const store::OperationRecord& r);
nlohmann::json SessionView(const store::SessionRecord& r);

}  // namespace sbx::service
