#include "api/cluster_router.h"

#include <gtest/gtest.h>

namespace sbx::api {
namespace {

using Kind = RouteKey::Kind;

http::Request Req(http::bhttp::verb v, std::string target, std::string host = "",
                  std::string body = "") {
  http::Request r{v, target, 11};
  if (!host.empty()) r.set(http::bhttp::field::host, host);
  r.body() = std::move(body);
  return r;
}

TEST(ClusterRouterTest, EachRequestGoesWhereItsObjectIs) {
  using V = http::bhttp::verb;
  struct Case {
    V verb;
    std::string target;
    Kind kind;
    std::string id;
  } cases[] = {
      {V::get, "/healthz", Kind::kLocal, ""},
      {V::get, "/readyz", Kind::kLocal, ""},
      {V::get, "/metrics", Kind::kLocal, ""},
      {V::post, "/v1/sandboxes", Kind::kCreate, ""},
      {V::get, "/v1/sandboxes?limit=5", Kind::kAny, ""},
      {V::get, "/v1/sandboxes/sbx_abc", Kind::kSandbox, "sbx_abc"},
      {V::post, "/v1/sandboxes/sbx_abc/sessions", Kind::kSandbox, "sbx_abc"},
      {V::get, "/v1/sandboxes/sbx_abc/files:list?path=/", Kind::kSandbox, "sbx_abc"},
      {V::get, "/v1/sandboxes/sbx_abc/ports/8080/x", Kind::kSandbox, "sbx_abc"},
      {V::get, "/v1/sessions/ses_1/attach", Kind::kSession, "ses_1"},
      {V::get, "//v1//sessions/ses_1/ws", Kind::kSession, "ses_1"},
      {V::post, "/v1/sessions/ses_1/stdin:close", Kind::kSession, "ses_1"},
      {V::get, "/v1/operations/op_1?wait_ms=100", Kind::kOperation, "op_1"},
      {V::post, "/v1/templates:import", Kind::kAny, ""},
      {V::get, "/v1/admin/nodes", Kind::kAny, ""},
      // E2B's control plane: its ids are ours with '-' for '_'.
      {V::post, "/sandboxes", Kind::kCreate, ""},
      {V::get, "/v2/sandboxes", Kind::kAny, ""},
      {V::post, "/sandboxes/sbx-abc/pause", Kind::kSandbox, "sbx_abc"},
      {V::delete_, "/sandboxes/sbx_abc", Kind::kSandbox, "sbx_abc"},
      {V::get, "/", Kind::kAny, ""},
      {V::get, "", Kind::kAny, ""},
  };
  for (const auto& c : cases) {
    const RouteKey k = Classify(Req(c.verb, c.target), "sbx.test");
    EXPECT_EQ(k.kind, c.kind) << c.target;
    EXPECT_EQ(k.id, c.id) << c.target;
  }
}

TEST(ClusterRouterTest, PortHostNamesAndE2bHeadersNameTheSandbox) {
  auto r = Req(http::bhttp::verb::get, "/v1/sandboxes", "8080-sbx-abc.sbx.test:7070");
  EXPECT_EQ(Classify(r, "sbx.test").id, "sbx_abc");
  EXPECT_EQ(Classify(r, "sbx.test").kind, Kind::kSandbox);
  // Host-name routing off: the path decides.
  EXPECT_EQ(Classify(r, "").kind, Kind::kAny);
  auto envd = Req(http::bhttp::verb::post, "/process.Process/Start");
  envd.set("E2b-Sandbox-Id", "sbx-xyz");
  EXPECT_EQ(Classify(envd, "").kind, Kind::kSandbox);
  EXPECT_EQ(Classify(envd, "").id, "sbx_xyz");
}

TEST(ClusterRouterTest, OnlyACreateBodyIsReadWhole) {
  EXPECT_FALSE(ClusterRouter::StreamsBody(Req(http::bhttp::verb::post, "/v1/sandboxes")));
  EXPECT_FALSE(ClusterRouter::StreamsBody(Req(http::bhttp::verb::post, "/sandboxes")));
  EXPECT_TRUE(ClusterRouter::StreamsBody(Req(http::bhttp::verb::put, "/v1/sandboxes/sbx_a/files")));
  EXPECT_TRUE(ClusterRouter::StreamsBody(Req(http::bhttp::verb::post, "/v1/templates:import")));
}

TEST(ClusterRouterTest, PlacementReadsTemplateRuntimeAndResources) {
  auto p = PlacementOf(Req(http::bhttp::verb::post, "/v1/sandboxes", "",
                           R"({"template":"python","runtime":"microvm",
                               "resources":{"vcpu":2,"memory_mib":512,"disk_mib":null}})"),
                       false);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->template_ref, "python:latest");
  EXPECT_EQ(p->runtime, "microvm");
  EXPECT_EQ(p->vcpu, 2);
  EXPECT_EQ(p->memory_mib, 512);
  EXPECT_EQ(p->disk_mib, 0);
  auto e2b = PlacementOf(Req(http::bhttp::verb::post, "/sandboxes", "",
                             R"({"templateID":"code-interpreter-v1:v2"})"),
                         true);
  ASSERT_TRUE(e2b.has_value());
  EXPECT_EQ(e2b->template_ref, "code-interpreter-v1:v2");
  auto plain = PlacementOf(Req(http::bhttp::verb::post, "/v1/sandboxes", "", "{}"), false);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->template_ref, "base");
  EXPECT_EQ(plain->runtime, "");
  // Not understood here: the node answers the 400.
  for (const char* bad : {"", "[]", "{\"template\": 7}", "{", "null"}) {
    EXPECT_FALSE(PlacementOf(Req(http::bhttp::verb::post, "/v1/sandboxes", "", bad), false))
        << bad;
  }
}

TEST(ClusterRouterTest, PlacementReadsTheAntiAffinityGroup) {
  auto p = PlacementOf(Req(http::bhttp::verb::post, "/v1/sandboxes", "",
                           R"({"labels":{"job":"j1","team":"red"},
                               "placement":{"anti_affinity":"job"}})"),
                       false);
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->anti_affinity);
  EXPECT_EQ(p->group_key, "job");
  EXPECT_EQ(p->group_value, "j1");
  EXPECT_EQ(p->tenant, "");  // the router asks tenant_of, which needs the credentials
  // Without a group to count, plain placement (the node refuses what is invalid).
  for (const char* body : {R"({"placement":{"anti_affinity":"job"}})",
                           R"({"labels":{"team":"red"},"placement":{"anti_affinity":"job"}})",
                           R"({"labels":{"job":7},"placement":{"anti_affinity":"job"}})",
                           R"({"labels":{"job":"x"},"placement":{"anti_affinity":7}})",
                           R"({"labels":{"job":"x"},"placement":"job"})"}) {
    auto q = PlacementOf(Req(http::bhttp::verb::post, "/v1/sandboxes", "", body), false);
    ASSERT_TRUE(q.has_value()) << body;
    EXPECT_FALSE(q->anti_affinity) << body;
  }
  // E2B's create has no such field.
  auto e2b = PlacementOf(Req(http::bhttp::verb::post, "/sandboxes", "",
                             R"({"templateID":"base","labels":{"job":"x"},
                                 "placement":{"anti_affinity":"job"}})"),
                         true);
  ASSERT_TRUE(e2b.has_value());
  EXPECT_FALSE(e2b->anti_affinity);
}

}  // namespace
}  // namespace sbx::api
