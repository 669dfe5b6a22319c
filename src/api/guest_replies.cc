// Replies whose size a guest chooses: the process list and directory listings (issue 13,
// finding 6). See protocol/guest_reply.h for why they are never parsed into a tree and
// service/reply_gate.h for why only a few are held at once.
#include <fmt/format.h>

#include "api/api.h"
#include "api/handler_util.h"
#include "common/status_util.h"
#include "service/agent_stream.h"

namespace sbx::api {

namespace bhttp = http::bhttp;

namespace {
constexpr auto kAgentCallTimeout = std::chrono::seconds(10);
// Body bytes per chunk written to the client: the chunk is copied once more on its way out.
constexpr size_t kBodyChunk = 256 << 10;
}  // namespace

http::asio::awaitable<std::optional<http::Response>> Api::GuestSizedReply(
    http::RequestContext& ctx, const std::string& sandbox_id, const std::string& socket,
    nlohmann::json request, const protocol::GuestListSchema& schema, std::string head) {
  auto slot = co_await svc_.guest_replies().Acquire(ctx.executor, sandbox_id);
  if (!slot.ok()) {
    http::Response res = Fail(ctx, slot.status());
    res.set(bhttp::field::retry_after, "1");
    co_return res;
  }
  auto payload = co_await service::AsyncCallAgentGuestSized(ctx.executor, socket,
                                                            std::move(request), kAgentCallTimeout);
  if (!payload.ok()) co_return Fail(ctx, payload.status());
  auto body = protocol::RewriteGuestList(*payload, schema, head);
  // The agent's bytes are not needed past here: free them before the (slow) write.
  std::string().swap(*payload);
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
