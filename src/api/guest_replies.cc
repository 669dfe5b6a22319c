// Replies whose size a guest chooses: the process list and directory listings (issue 13,
// finding 6). See service/agent_client.h (ProcessesBody, ListBody) for why they are never
// parsed into a tree and
// service/reply_gate.h for why only a few are held at once.
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "common/status_util.h"
#include "service/agent_client.h"

namespace sbx::api {

namespace bhttp = http::bhttp;

namespace {
// Body bytes per chunk written to the client: the chunk is copied once more on its way out.
constexpr size_t kBodyChunk = 256 << 10;
}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::GuestSizedReply(
    http::RequestContext& ctx, const std::string& sandbox_id, GuestSizedFetch fetch) {
  auto slot = co_await svc_.guest_replies().Acquire(ctx.executor, sandbox_id);
  if (!slot.ok()) {
    http::Response res = Fail(ctx, slot.status());
    res.set(bhttp::field::retry_after, "1");
    co_return res;
  }
  auto body = co_await fetch();
  if (!body.ok()) co_return Fail(ctx, body.status());

  bhttp::response_header<> header;
  header.result(bhttp::status::ok);
  header.version(ctx.req.version());
  header.set(bhttp::field::content_type, "application/json");
  header.set(bhttp::field::cache_control, "no-store");
  header.set("X-Request-Id", ctx.request_id);
  if (!ctx.req.keep_alive()) header.set(bhttp::field::connection, "close");
  if (!co_await ctx.stream.Begin(std::move(header))) co_return std::nullopt;
  for (size_t at = 0; at < body->size(); at += kBodyChunk) {
    if (!co_await ctx.stream.Write(body->substr(at, kBodyChunk))) co_return std::nullopt;
  }
  co_await ctx.stream.End();
  co_return std::nullopt;
}

}  // namespace sbx::api
