// Request parsers: JSON text -> validated request structs. They are the only code that looks at
// untrusted request bodies, so they reject anything unexpected (unknown fields, wrong types,
// out-of-range values) with a 400 naming the field, and they never throw.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "runtime/resources.h"
#include "service/inputs.h"

namespace sbx::api {

// Every body and control message is measured before it is parsed (common/json_util.h): deeper
// is 400 invalid_argument, "... nests deeper than 64 levels".
inline constexpr int kMaxRequestJsonDepth = kMaxUntrustedJsonDepth;

// What a create may ask for: sbxd's [sandbox.limits] configuration (docs/config.md), which
// replaces the built-in ones (runtime/resources.h) at start-up and on a reload.
using ResourceLimits = runtime::ResourceLimits;

using CreateSandboxRequest = service::CreateSandboxRequest;
using CreateSessionRequest = service::CreateSessionRequest;

// An empty body is accepted as "{}" for create-sandbox (every field has a default).
absl::StatusOr<CreateSandboxRequest> ParseCreateSandbox(const std::string& body,
                                                        const ResourceLimits& limits);
absl::StatusOr<CreateSessionRequest> ParseCreateSession(const std::string& body);
// POST /v1/admin/tenants (`create`: name required) and PATCH /v1/admin/tenants/{id}.
absl::StatusOr<service::TenantSpec> ParseTenantSpec(const std::string& body, bool create);
// POST /v1/admin/tenants/{id}/tokens: {"name", "scopes": [...], "expires_in_s"?}. The scope
// names are checked by the service.
absl::StatusOr<service::TokenSpec> ParseTokenSpec(const std::string& body);
// pause, suspend and wake take no fields: an empty body or an empty JSON object.
absl::Status ParseLifecycleBody(const std::string& body);
// PATCH /v1/sandboxes/{id}/egress: {"allow": [rules]} (the rules are checked by the service,
// against the sandbox's profile).
absl::StatusOr<nlohmann::json> ParseEgressPatch(const std::string& body);

// Query parameters: "limit" 1..500 (default 50).
absl::StatusOr<int> ParseLimit(const std::optional<std::string>& value);
// `?wait_ms=` of GET /v1/operations/{id}: how long to hold the request until the operation is
// finished (0, the default, answers at once).
inline constexpr int kMaxWaitMs = 60000;
absl::StatusOr<int> ParseWaitMs(const std::optional<std::string>& value);
// "label=key=value" filter.
absl::StatusOr<std::pair<std::string, std::string>> ParseLabelFilter(const std::string& value);
// Idempotency-Key: 1..255 printable ASCII.
absl::Status ValidateIdempotencyKey(const std::string& key);
// Last-Event-ID: a non-negative integer.
absl::StatusOr<uint64_t> ParseLastEventId(const std::string& value);

// POST /v1/sessions/{id}/stdin: the bytes to write. The body is the raw bytes unless the
// Content-Type is application/json, then {"data":"text"} or {"data_b64":"base64"} (one of
// them). At most kMaxStdinBytes per request: payload_too_large (413) otherwise.
inline constexpr size_t kMaxStdinBytes = 512 << 10;
absl::StatusOr<std::string> ParseStdinBody(const std::string& body, bool json_body);
// POST /v1/sessions/{id}/signal: {"signal":"TERM"|"SIGTERM"|15}; the signal number.
absl::StatusOr<int> ParseSignalBody(const std::string& body);
// POST /v1/sessions/{id}/resize: {"rows":R,"cols":C}, each 1..1000.
absl::StatusOr<std::pair<int, int>> ParseResizeBody(const std::string& body);
// The same two on an already parsed (depth-checked) object.
absl::StatusOr<int> ParseSignalObject(const nlohmann::json& obj);
absl::StatusOr<std::pair<int, int>> ParseResizeObject(const nlohmann::json& obj);

// A text message of GET /v1/sessions/{id}/ws: {"type":"resize","rows","cols"},
// {"type":"signal","signal"} or {"type":"stdin_close"}, checked like the HTTP routes' bodies.
// A message that nests too deep is refused with IsJsonTooDeep() true on the status.
struct WsControl {
  enum class Type { kResize, kSignal, kStdinClose };
  Type type = Type::kStdinClose;
  int rows = 0, cols = 0;  // kResize
  int signal = 0;          // kSignal
};
absl::StatusOr<WsControl> ParseWsControl(std::string_view text);
// The largest message a WebSocket client may send (a stdin chunk or a control message).
inline constexpr size_t kMaxWsClientMessage = 1 << 20;

}  // namespace sbx::api
