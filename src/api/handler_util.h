// What every route handler of the api/ layer (api.cc, files_api.cc, session_io.cc,
// session_ws.cc) answers the same way.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/target.h"
#include "http/server.h"

namespace sbx::api {

// The error response for `s` (status_to_http.cc picks the code); a 500 is also logged, with the
// request's context, since only the log can explain it to an operator.
http::Response Fail(const http::RequestContext& ctx, const absl::Status& s);
// 405 method_not_allowed, naming the method and the target; `allow` ("GET, PUT") becomes the
// answer's Allow header (RFC 9110 requires it on every 405).
absl::Status MethodNotAllowed(const http::Request& req, std::string_view allow);
// Which form of the attach stream the client asked for: `?format=sse|binary`, else an Accept
// header naming the binary type (docs/api.md, "attach"); SSE by default. 400 for another
// `format`.
absl::StatusOr<bool> WantsBinaryAttach(const http::Request& req, const Target& t);

}  // namespace sbx::api
