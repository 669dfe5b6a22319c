#include "service/service_internal.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/status_util.h"
#include "common/time_util.h"

namespace sbx::service::internal {

absl::Status BadId(std::string_view kind, const std::string& id) {
  std::string shown = id.size() > 64 ? id.substr(0, 64) + "..." : id;
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                  fmt::format("'{}' is not a {} id", shown, kind), "id");
}

absl::Status NotFound(std::string_view kind, const std::string& id) {
  return ApiError(absl::StatusCode::kNotFound, "not_found",
                  fmt::format("{} {} not found", kind, id));
}

json ErrorJson(std::string_view code, const absl::Status& s) {
  return {{"code", code}, {"message", std::string(s.message())}};
}

absl::StatusOr<std::optional<Rendered>> CheckIdempotency(Tx& tx, const Caller& caller,
                                                         const std::optional<Idempotency>& idem,
                                                         const std::string& body_hash) {
  if (!idem) return std::optional<Rendered>();
  SBX_ASSIGN_OR_RETURN(auto rec,
                       tx.GetIdempotency(caller.tenant_id, idem->key, idem->method, idem->route));
  if (!rec) return std::optional<Rendered>();
  if (rec->body_hash != body_hash) {
    return ApiError(absl::StatusCode::kFailedPrecondition, "idempotency_key_reused",
                    "Idempotency-Key was already used with a different request body");
  }
  return std::optional<Rendered>(Rendered{rec->status, rec->response_body});
}

absl::Status SaveIdempotency(Tx& tx, const Caller& caller, const std::optional<Idempotency>& idem,
                             const std::string& body_hash, const Result& result) {
  if (!idem) return absl::OkStatus();
  const Rendered rendered = idem->render(result);
  store::IdempotencyRecord rec;
  rec.tenant_id = caller.tenant_id;
  rec.key = idem->key;
  rec.method = idem->method;
  rec.route = idem->route;
  rec.body_hash = body_hash;
  rec.status = rendered.status;
  rec.response_body = rendered.body;
  rec.created_at = NowRfc3339();
  return tx.PutIdempotency(rec);
}

OperationRecord NewOperation(const std::string& tenant, const std::string& kind,
                             const std::string& sandbox_id, const std::string& now) {
  OperationRecord op;
  op.id = NewId("op");
  op.tenant_id = tenant;
  op.kind = kind;
  op.sandbox_id = sandbox_id;
  op.state = "pending";
  op.created_at = now;
  op.updated_at = now;
  return op;
}

log::Context OperationLog(const std::string& op_id, const std::string& sandbox_id,
                          const std::string& tenant) {
  log::Context c = log::Current();
  c.operation = op_id;
  c.sandbox = sandbox_id;
  c.tenant = tenant;
  return c;
}

void LogStateChange(const std::string& sandbox_id, std::string_view from, std::string_view to,
                    std::string_view why) {
  if (!spdlog::should_log(spdlog::level::info) || from == to) return;
  log::Context c;
  c.sandbox = sandbox_id;
  log::Scope scope(c);
  log::Event(spdlog::level::info, {{"from", from}, {"to", to}}, "sandbox {}: {} -> {}{}{}{}",
             sandbox_id, from.empty() ? "new" : from, to, why.empty() ? "" : " (", why,
             why.empty() ? "" : ")");
}

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void LogOperationStarted(std::string_view kind) {
  log::Event(spdlog::level::info, {{"kind", kind}}, "operation {} started", kind);
}

void LogOperationFinished(std::string_view kind, std::string_view result, Clock::time_point started,
                          double runtime_ms, std::string_view error) {
  const double ms = MsSince(started);
  const auto level = result == "failed" ? spdlog::level::warn : spdlog::level::info;
  const std::string runtime =
      runtime_ms >= 0 ? fmt::format(" ({:.1f} ms in the runtime)", runtime_ms) : std::string();
  if (runtime_ms >= 0) {
    log::Event(level,
               {{"kind", kind}, {"result", result}, {"duration_ms", ms}, {"runtime_ms", runtime_ms}},
               "operation {} {} in {:.1f} ms{}{}{}", kind, result, ms, runtime,
               error.empty() ? "" : ": ", error);
  } else {
    log::Event(level, {{"kind", kind}, {"result", result}, {"duration_ms", ms}},
               "operation {} {} in {:.1f} ms{}{}", kind, result, ms, error.empty() ? "" : ": ",
               error);
  }
}

void Finish(OperationRecord& op, bool ok, json error, const std::string& now) {
  op.state = ok ? "succeeded" : "failed";
  op.error = std::move(error);
  op.updated_at = now;
  op.completed_at = now;
}

std::string_view ResultOf(const OperationRecord& op) {
  if (op.state == "succeeded") return "succeeded";
  const bool cancelled = op.error.is_object() && op.error.value("code", "") == "cancelled";
  return cancelled ? "cancelled" : "failed";
}

std::string StoreError(const absl::Status& s) {
  return s.ok() ? std::string() : fmt::format("store: {}", std::string(s.message()));
}

}  // namespace sbx::service::internal
