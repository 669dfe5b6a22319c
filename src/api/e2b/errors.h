// The one place that turns sbx errors into E2B's: the REST body {"code": <http status>,
// "message"} whose `code` the SDKs read (a kill answered 404 without it throws instead of
// returning false), and the Connect error codes of envd's RPCs (connect.h RpcErrorFor).
//
// The statuses are sbx's own (api/status_to_http.h) except where an SDK reads a status as a
// meaning: envd's "the sandbox is gone" is 502 (the SDKs raise TimeoutError and isRunning()
// says false), and a paused sandbox's pause is 409 (pause() returns false).
#pragma once

#include "absl/status/status.h"
#include "http/server.h"

namespace sbx::api::e2b {

enum class Side { kControlPlane, kEnvd };

unsigned RestStatusFor(const absl::Status& s, Side side);
// {"code": status, "message": …} with that status; X-Request-Id set.
http::Response RestError(const http::RequestContext& ctx, const absl::Status& s, Side side);
// A JSON success body with Content-Length (the SDKs' openapi clients want one).
http::Response RestJson(const http::RequestContext& ctx, unsigned status,
                        const std::string& body);
http::Response RestEmpty(const http::RequestContext& ctx, unsigned status);

}  // namespace sbx::api::e2b
