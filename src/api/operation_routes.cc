// /v1/operations/{id}, with its long poll (wait_ms), and its event stream.
#include <charconv>

#include "api/handler_util.h"
#include "api/render.h"
#include "api/requests.h"
#include "api/routes.h"
#include "service/template_service.h"
#include "service/views.h"
#include "api/target.h"
#include "common/status_util.h"
#include <nlohmann/json.hpp>

namespace sbx::api {

namespace bhttp = http::bhttp;

Awaitable Routes::GetOperation(Api& api, Call& call) {
  auto wait_ms = ParseWaitMs(call.target.Query("wait_ms"));
  if (!wait_ms.ok()) co_return Fail(call.ctx, wait_ms.status());
  auto op = co_await api.WaitForOperation(call.ctx, call.caller, call.id,
                                          std::chrono::milliseconds(*wait_ms));
  if (!op.ok()) co_return Fail(call.ctx, op.status());
  co_return RenderJson(bhttp::status::ok, service::OperationView(*op));
}

}  // namespace sbx::api

namespace sbx::api {

// GET /v1/operations/{id}/events: Server-Sent Events of an operation until it ends: `log`
// ({"line"}) for each line of a template operation's log, `progress` (the progress object)
// when it changes, and `done` (the operation) last. Ids name the log lines: Last-Event-ID (or
// ?after=) resumes after one. Operations this sbxd did not run (before a restart) replay the
// stored last lines of their log.
Awaitable Routes::OperationEvents(Api& api, Call& call) {
  namespace asio = http::asio;
  auto op = api.svc_.GetOperation(call.caller, call.id);
  if (!op.ok()) co_return Fail(call.ctx, op.status());
  uint64_t after = 0;
  std::optional<std::string> resume = call.target.Query("after");
  if (auto h = call.ctx.req.find("Last-Event-ID"); h != call.ctx.req.end()) {
    resume = std::string(h->value());
  }
  if (resume) {
    auto [p, ec] = std::from_chars(resume->data(), resume->data() + resume->size(), after);
    if (ec != std::errc() || p != resume->data() + resume->size()) {
      co_return Fail(call.ctx,
                     FieldError("after", "after (Last-Event-ID) must be an event id: an integer"));
    }
  }
  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(call.ctx.req.version());
  header.set(bhttp::field::content_type, "text/event-stream");
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Accel-Buffering", "no");
  header.set("X-Request-Id", call.ctx.request_id);
  if (!call.ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await call.ctx.stream.Begin(std::move(header))) co_return std::nullopt;

  service::TemplateService* tpl = api.opts_.templates;
  bool replayed = false;
  std::string last_progress;
  auto quiet_since = std::chrono::steady_clock::now();
  asio::steady_timer timer(call.ctx.executor);
  for (;;) {
    std::string batch;
    auto lines = tpl != nullptr ? tpl->Events(call.id, after)
                                : absl::StatusOr<service::TemplateService::EventLines>(
                                      absl::NotFoundError("no templates"));
    if (lines.ok()) {
      for (const auto& [id, line] : lines->lines) {
        batch += SseEvent(id, "log", nlohmann::json{{"line", line}}.dump(
                                         -1, ' ', false, nlohmann::json::error_handler_t::replace));
        after = id;
      }
    } else if (!replayed) {
      // Not run by this sbxd: its stored last lines, once.
      const nlohmann::json& stored = op->progress.is_object() && op->progress.contains("log")
                                         ? op->progress["log"]
                                         : nlohmann::json::array();
      uint64_t id = 0;
      for (const auto& l : stored) {
        if (++id > after && l.is_string()) {
          batch += SseEvent(id, "log", nlohmann::json{{"line", l}}.dump());
          after = id;
        }
      }
    }
    replayed = true;
    op = api.svc_.GetOperation(call.caller, call.id);
    if (!op.ok()) break;  // deleted meanwhile (a sandbox's delete): end the stream
    const std::string progress = op->progress.dump();
    if (progress != last_progress && !op->progress.is_null()) {
      nlohmann::json p = op->progress;
      if (p.is_object()) p.erase("log");  // its lines came as `log` events
      batch += SseEvent(0, "progress", p.dump());
      last_progress = progress;
    }
    const bool done = op->state == "succeeded" || op->state == "failed";
    if (done) batch += SseEvent(0, "done", service::OperationView(*op).dump());
    if (batch.empty() && std::chrono::steady_clock::now() - quiet_since >= api.opts_.keepalive_interval) {
      batch = ": keepalive\n\n";
    }
    if (!batch.empty()) {
      quiet_since = std::chrono::steady_clock::now();
      if (!co_await call.ctx.stream.Write(std::move(batch))) co_return std::nullopt;
    }
    if (done) break;
    timer.expires_after(std::chrono::milliseconds(100));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_await call.ctx.stream.End();
  co_return std::nullopt;
}

}  // namespace sbx::api
