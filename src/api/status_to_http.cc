#include "api/status_to_http.h"

#include <charconv>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/status_util.h"

namespace sbx::api {

using bhttp = http::bhttp::status;

http::bhttp::status HttpStatusFor(const absl::Status& s) {
  const std::string code = ApiErrorCode(s);
  // API codes whose status differs from the canonical code's.
  if (code == "template_not_found") return bhttp::unprocessable_entity;
  // A sandbox its TTL deleted, while its record is kept: gone, not missing (docs/api.md).
  if (code == "sandbox_expired") return bhttp::gone;
  if (code == "payload_too_large") return bhttp::payload_too_large;
  if (code == "method_not_allowed") return bhttp::method_not_allowed;
  // An agent reply outside the protocol's bounds (its per-frame limits): the upstream is at fault.
  if (code == "bad_agent_reply") return bhttp::bad_gateway;
  // Port exposure: nothing listens on the sandbox port, or it broke off (port_routes.cc).
  if (code == "port_unreachable") return bhttp::bad_gateway;
  // A cluster's api replica could not reach the node (cluster_router.cc).
  if (code == "node_unreachable") return bhttp::bad_gateway;
  // Admission (service/admission.h): full now (a delete makes room), or never.
  if (code == "insufficient_capacity") return bhttp::service_unavailable;
  if (code == "exceeds_capacity") return bhttp::unprocessable_entity;
  // Files API (docs/api.md, "Files").
  if (code == "insufficient_storage") return bhttp::insufficient_storage;
  if (code == "range_not_satisfiable") return bhttp::range_not_satisfiable;
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return bhttp::ok;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return bhttp::bad_request;
    case absl::StatusCode::kUnauthenticated:
      return bhttp::unauthorized;
    case absl::StatusCode::kPermissionDenied:
      return bhttp::forbidden;
    case absl::StatusCode::kNotFound:
      return bhttp::not_found;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return bhttp::conflict;
    case absl::StatusCode::kResourceExhausted:
      return bhttp::too_many_requests;
    case absl::StatusCode::kUnimplemented:
      return bhttp::not_implemented;
    case absl::StatusCode::kUnavailable:
      return bhttp::service_unavailable;
    case absl::StatusCode::kDeadlineExceeded:
      return bhttp::gateway_timeout;
    default:
      return bhttp::internal_server_error;
  }
}

std::string ApiCodeFor(const absl::Status& s) {
  std::string code = ApiErrorCode(s);
  if (!code.empty()) return code;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return "invalid_argument";
    case absl::StatusCode::kUnauthenticated:
      return "unauthenticated";
    case absl::StatusCode::kPermissionDenied:
      return "permission_denied";
    case absl::StatusCode::kNotFound:
      return "not_found";
    case absl::StatusCode::kAlreadyExists:
      return "already_exists";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kAborted:
      return "aborted";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case absl::StatusCode::kUnimplemented:
      return "not_implemented";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    default:
      return "internal";
  }
}

http::Response JsonResponse(http::bhttp::status status, const std::string& body) {
  http::Response res{status, 11};
  res.set(http::bhttp::field::content_type, "application/json");
  res.set(http::bhttp::field::cache_control, "no-store");
  res.body() = body;
  if (!res.body().empty() && res.body().back() != '\n') res.body().push_back('\n');
  return res;
}

http::Response RawErrorResponse(http::bhttp::status status, std::string_view code,
                                std::string_view message, const std::string& request_id) {
  nlohmann::json err = {{"code", code}, {"message", message}, {"request_id", request_id}};
  auto res = JsonResponse(status, nlohmann::json{{"error", err}}.dump());
  res.set("X-Request-Id", request_id);
  return res;
}

http::Response ErrorResponse(const absl::Status& s, const std::string& request_id) {
  nlohmann::json err = {{"code", ApiCodeFor(s)},
                        {"message", std::string(s.message())},
                        {"request_id", request_id}};
  nlohmann::json details = nlohmann::json::object();
  if (std::string field = ApiErrorField(s); !field.empty()) details["field"] = field;
  if (std::string op = ApiErrorDetail(s, "operation_id"); !op.empty()) {
    details["operation_id"] = op;
  }
  for (const char* key : {"resource", "scope", "quota", "reason", "expired_at"}) {
    if (std::string v = ApiErrorDetail(s, key); !v.empty()) details[key] = v;
  }
  for (const char* key : {"requested", "available", "capacity", "limit", "used"}) {
    const std::string v = ApiErrorDetail(s, key);
    int64_t n = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (!v.empty() && ec == std::errc() && end == v.data() + v.size()) details[key] = n;
  }
  if (!details.empty()) err["details"] = details;
  auto res = JsonResponse(HttpStatusFor(s), nlohmann::json{{"error", err}}.dump(
                                                -1, ' ', false, nlohmann::json::error_handler_t::replace));
  res.set("X-Request-Id", request_id);
  if (std::string allow = ApiErrorDetail(s, "allow"); !allow.empty()) {
    res.set(http::bhttp::field::allow, allow);
  }
  // Capacity comes back when some sandbox is deleted: a client may try again, not at once.
  if (ApiCodeFor(s) == "insufficient_capacity") res.set(http::bhttp::field::retry_after, "5");
  return res;
}

}  // namespace sbx::api
