// What every route handler of the api/ layer (api.cc, files_api.cc, session_io.cc,
// session_ws.cc) answers the same way.
#pragma once

#include "absl/status/status.h"
#include "http/server.h"

namespace sbx::api {

// The error response for `s` (status_to_http.cc picks the code); a 500 is also logged, with the
// request's context, since only the log can explain it to an operator.
http::Response Fail(const http::RequestContext& ctx, const absl::Status& s);
// 405 method_not_allowed, naming the method and the target.
absl::Status MethodNotAllowed(const http::Request& req);

}  // namespace sbx::api
