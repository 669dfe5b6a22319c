#include "api/render.h"

#include <fmt/format.h>

#include "api/requests.h"
#include "api/status_to_http.h"
#include "common/status_util.h"
#include "service/views.h"

namespace sbx::api {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;

// Each kind of result: its status and body. The bodies are dumped as they always were: a
// replay answers with the bytes stored then.
struct Renderer {
  service::Rendered operator()(const service::SandboxCreated& r) const {
    return {static_cast<int>(bhttp::status::accepted),
            json{{"sandbox", service::SandboxView(r.sandbox)},
                 {"operation", service::OperationView(r.operation)}}
                .dump()};
  }
  service::Rendered operator()(const service::OperationStarted& r) const {
    return {static_cast<int>(bhttp::status::accepted),
            json{{"operation", service::OperationView(r.operation)}}.dump()};
  }
  service::Rendered operator()(const service::SessionCreated& r) const {
    return {static_cast<int>(bhttp::status::created),
            json{{"session_id", r.session.id},
                 {"sandbox_id", r.session.sandbox_id},
                 {"state", r.session.state},
                 {"attach",
                  {{"url", fmt::format("/v1/sessions/{}/attach", r.session.id)},
                   {"token", r.attach.token},
                   {"expires_at", r.attach.expires_at}}}}
                .dump()};
  }
};

}  // namespace

http::Response RenderJson(bhttp::status status, const json& body) {
  return JsonResponse(status, body.dump(-1, ' ', false, json::error_handler_t::replace));
}

service::Rendered Render(const service::Result& result) { return std::visit(Renderer{}, result); }

http::Response RenderAnswer(const service::Rendered& rendered, bool replayed) {
  auto res = JsonResponse(static_cast<bhttp::status>(rendered.status), rendered.body);
  if (replayed) res.set("Idempotent-Replayed", "true");
  return res;
}

absl::StatusOr<std::optional<service::Idempotency>> IdempotencyFor(const http::Request& req,
                                                                   std::string route) {
  auto it = req.find("Idempotency-Key");
  if (it == req.end()) return std::optional<service::Idempotency>();
  std::string key(it->value());
  SBX_RETURN_IF_ERROR(ValidateIdempotencyKey(key));
  return std::optional<service::Idempotency>(service::Idempotency{
      std::move(key), std::string(req.method_string()), std::move(route), &Render});
}

}  // namespace sbx::api
