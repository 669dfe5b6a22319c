// The one place where errors become HTTP: a canonical absl code (plus the optional API error
// code and field attached with sbx::ApiError) maps to a status and the JSON error body
//   {"error":{"code":"…","message":"…","request_id":"…","details":{…}}}.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "http/server.h"

namespace sbx::api {

http::bhttp::status HttpStatusFor(const absl::Status& s);
std::string ApiCodeFor(const absl::Status& s);
http::Response ErrorResponse(const absl::Status& s, const std::string& request_id);
// For errors the HTTP layer raises itself (malformed request, body too large, timeouts).
http::Response RawErrorResponse(http::bhttp::status status, std::string_view code,
                                std::string_view message, const std::string& request_id);
http::Response JsonResponse(http::bhttp::status status, const std::string& body);

}  // namespace sbx::api
