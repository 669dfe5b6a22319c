// Service results -> HTTP: the one place that chooses the status of every success (errors:
// status_to_http.h), and renders what an Idempotency-Key replays.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "http/server.h"
#include "service/results.h"

namespace sbx::api {

http::Response RenderJson(http::bhttp::status status, const nlohmann::json& body);
// A state-changing call's result as the client gets it, first time and on every replay.
service::Rendered Render(const service::Result& result);

// The answer of a state-changing call: its result rendered, or the stored first answer
// replayed (with Idempotent-Replayed: true).
http::Response RenderAnswer(const service::Rendered& rendered, bool replayed);
template <typename T>
http::Response RenderAnswer(const service::Answer<T>& a) {
  if (a.replay) return RenderAnswer(*a.replay, /*replayed=*/true);
  return RenderAnswer(Render(service::Result(*a.result)), /*replayed=*/false);
}

// The request's Idempotency-Key (validated), scoped to its method and `route`; nullopt
// without the header.
absl::StatusOr<std::optional<service::Idempotency>> IdempotencyFor(const http::Request& req,
                                                                   std::string route);

}  // namespace sbx::api
