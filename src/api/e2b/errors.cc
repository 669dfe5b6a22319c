#include "api/e2b/errors.h"

#include <nlohmann/json.hpp>

#include "api/e2b/connect.h"
#include "api/status_to_http.h"
#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;

// The sandbox cannot answer (deleted, expired, not running, its agent gone): envd's proxy says
// 502, which the SDKs read as "the sandbox timed out or was killed".
bool SandboxGone(const std::string& code) {
  return code == "sandbox_not_running" || code == "agent_unavailable" ||
         code == "sandbox_failed" || code == "sandbox_expired";
}

}  // namespace

unsigned RestStatusFor(const absl::Status& s, Side side) {
  const std::string code = ApiCodeFor(s);
  if (side == Side::kEnvd && SandboxGone(code)) return 502;
  // envd's /files (e2b-compat.md §6.2-6.3): a path that is no file to read or write is 400
  // (InvalidArgumentError), an unknown user 401, no room 507 (NotEnoughSpaceError): the
  // sandbox's disk cap as well as a full disk.
  if (side == Side::kEnvd) {
    if (code == "is_a_directory" || code == "not_a_directory" || code == "not_a_regular_file" ||
        code == "invalid_path" || code == "path_outside_root") {
      return 400;
    }
    if (code == "unknown_user") return 401;
    if (code == "payload_too_large" || code == "insufficient_storage") return 507;
  }
  // E2B answers an unknown sandbox with 404 whether it never existed or expired.
  if (code == "sandbox_expired") return 404;
  // A template that does not exist is E2B's 404 (sbx: 422, the body names what is visible).
  if (code == "template_not_found") return 404;
  return static_cast<unsigned>(HttpStatusFor(s));
}

http::Response RestError(const http::RequestContext& ctx, const absl::Status& s, Side side) {
  const unsigned status = RestStatusFor(s, side);
  nlohmann::json body = {{"code", status}, {"message", std::string(s.message())}};
  http::Response res = RestJson(ctx, status, body.dump(-1, ' ', false,
                                                       nlohmann::json::error_handler_t::replace));
  if (status == 429 || status == 503) res.set(bhttp::field::retry_after, "1");
  if (std::string allow = ApiErrorDetail(s, "allow"); !allow.empty()) res.set(bhttp::field::allow, allow);
  return res;
}

http::Response RestJson(const http::RequestContext& ctx, unsigned status,
                        const std::string& body) {
  http::Response res{static_cast<bhttp::status>(status), ctx.req.version()};
  res.set(bhttp::field::content_type, "application/json");
  res.set(bhttp::field::cache_control, "no-store");
  res.set("X-Request-Id", ctx.request_id);
  res.body() = body;
  res.prepare_payload();
  return res;
}

http::Response RestEmpty(const http::RequestContext& ctx, unsigned status) {
  http::Response res{static_cast<bhttp::status>(status), ctx.req.version()};
  res.set("X-Request-Id", ctx.request_id);
  res.prepare_payload();
  return res;
}

RpcError RpcErrorFor(const absl::Status& s) {
  const std::string code = ApiCodeFor(s);
  RpcError e;
  e.message = std::string(s.message());
  if (SandboxGone(code)) {
    e.code = Code::kUnavailable;
  } else if (code == "is_a_directory" || code == "not_a_directory" ||
             code == "directory_not_empty" || code == "invalid_path" ||
             code == "path_outside_root" || code == "cross_device") {
    e.code = Code::kInvalidArgument;
  } else if (code == "insufficient_storage") {
    e.code = Code::kResourceExhausted;
  } else if (code == "unknown_user") {
    e.code = Code::kUnauthenticated;
  } else {
    switch (s.code()) {
      case absl::StatusCode::kCancelled: e.code = Code::kCanceled; break;
      case absl::StatusCode::kInvalidArgument: e.code = Code::kInvalidArgument; break;
      case absl::StatusCode::kDeadlineExceeded: e.code = Code::kDeadlineExceeded; break;
      case absl::StatusCode::kNotFound: e.code = Code::kNotFound; break;
      case absl::StatusCode::kAlreadyExists: e.code = Code::kAlreadyExists; break;
      case absl::StatusCode::kPermissionDenied: e.code = Code::kPermissionDenied; break;
      case absl::StatusCode::kResourceExhausted: e.code = Code::kResourceExhausted; break;
      case absl::StatusCode::kFailedPrecondition: e.code = Code::kFailedPrecondition; break;
      case absl::StatusCode::kAborted: e.code = Code::kAborted; break;
      case absl::StatusCode::kOutOfRange: e.code = Code::kOutOfRange; break;
      case absl::StatusCode::kUnimplemented: e.code = Code::kUnimplemented; break;
      case absl::StatusCode::kUnavailable: e.code = Code::kUnavailable; break;
      case absl::StatusCode::kDataLoss: e.code = Code::kDataLoss; break;
      case absl::StatusCode::kUnauthenticated: e.code = Code::kUnauthenticated; break;
      case absl::StatusCode::kInternal: e.code = Code::kInternal; break;
      default: e.code = Code::kUnknown; break;
    }
  }
  return e;
}

}  // namespace sbx::api::e2b
