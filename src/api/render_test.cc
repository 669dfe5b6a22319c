#include "api/render.h"

#include <gtest/gtest.h>

#include "service/views.h"

namespace sbx::api {
namespace {

using nlohmann::json;

store::OperationRecord Op() {
  store::OperationRecord op;
  op.id = "op_1";
  op.tenant_id = "default";
  op.kind = "pause";
  op.sandbox_id = "sbx_1";
  op.state = "pending";
  op.created_at = op.updated_at = "2026-01-01T00:00:00Z";
  return op;
}

TEST(Render, SandboxCreatedIs202WithSandboxAndOperation) {
  store::SandboxRecord sb;
  sb.id = "sbx_1";
  sb.state = "creating";
  const service::Rendered r = Render(service::SandboxCreated{sb, Op()});
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, json({{"sandbox", service::SandboxView(sb)},
                          {"operation", service::OperationView(Op())}})
                        .dump());
}

TEST(Render, OperationStartedIs202WithOperation) {
  const service::Rendered r = Render(service::OperationStarted{Op()});
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, json({{"operation", service::OperationView(Op())}}).dump());
}

TEST(Render, SessionCreatedIs201WithAttachUrlAndToken) {
  store::SessionRecord s;
  s.id = "ses_1";
  s.sandbox_id = "sbx_1";
  s.state = "created";
  const service::Rendered r =
      Render(service::SessionCreated{s, {"sat1.tok", "2026-01-01T00:15:00Z"}});
  EXPECT_EQ(r.status, 201);
  // The exact bytes of the previous versions' answer: replays of their records must match.
  EXPECT_EQ(r.body,
            R"({"attach":{"expires_at":"2026-01-01T00:15:00Z","token":"sat1.tok",)"
            R"("url":"/v1/sessions/ses_1/attach"},"sandbox_id":"sbx_1","session_id":"ses_1",)"
            R"("state":"created"})");
}

TEST(Render, ReplayIsMarked) {
  service::Answer<service::OperationStarted> replay;
  replay.replay = service::Rendered{202, R"({"operation":{}})"};
  http::Response res = RenderAnswer(replay);
  EXPECT_EQ(res.result_int(), 202u);
  EXPECT_EQ(res.body(), "{\"operation\":{}}\n");  // as stored, ended by a newline
  EXPECT_EQ(res["Idempotent-Replayed"], "true");

  service::Answer<service::OperationStarted> fresh;
  fresh.result = service::OperationStarted{Op()};
  http::Response first = RenderAnswer(fresh);
  EXPECT_EQ(first.result_int(), 202u);
  EXPECT_EQ(first.find("Idempotent-Replayed"), first.end());
}

TEST(Render, IdempotencyKeyScope) {
  http::Request req{http::bhttp::verb::delete_, "/v1/sandboxes/sbx_1", 11};
  auto none = IdempotencyFor(req, "/v1/sandboxes/sbx_1");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  req.set("Idempotency-Key", "k-1");
  auto some = IdempotencyFor(req, "/v1/sandboxes/sbx_1");
  ASSERT_TRUE(some.ok());
  ASSERT_TRUE(some->has_value());
  EXPECT_EQ((*some)->key, "k-1");
  EXPECT_EQ((*some)->method, "DELETE");
  EXPECT_EQ((*some)->route, "/v1/sandboxes/sbx_1");
  EXPECT_EQ((*some)->render(service::OperationStarted{Op()}).status, 202);
  req.set("Idempotency-Key", std::string(300, 'k'));
  EXPECT_FALSE(IdempotencyFor(req, "/v1/sandboxes/sbx_1").ok());
}

}  // namespace
}  // namespace sbx::api
