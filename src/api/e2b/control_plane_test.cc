#include <gtest/gtest.h>

#include "api/e2b/e2b.h"
#include "api/e2b/errors.h"
#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

using nlohmann::json;

const json kWithOpen = {{"egress_profiles", {{{"name", "none"}}, {{"name", "open"}}}}};
const json kNoneOnly = {{"egress_profiles", {{{"name", "none"}}}}};

TEST(TranslateCreate, MapsE2bFieldsToSbxOnes) {
  auto r = TranslateCreate(json::parse(R"({"templateID":"base","metadata":{"suite":"a"},
      "envVars":{"X":"1"},"timeout":120})"),
                           kWithOpen);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["template"], "base");
  EXPECT_EQ((*r)["labels"], json({{"suite", "a"}}));
  EXPECT_EQ((*r)["env"], json({{"X", "1"}}));
  EXPECT_EQ((*r)["timeout_s"], 120);
  EXPECT_EQ((*r)["egress_profile"], "open");  // E2B's default: internet on
}

TEST(TranslateCreate, DefaultsAndInternetAccess) {
  auto r = TranslateCreate(json::parse(R"({"templateID":"t"})"), kNoneOnly);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["timeout_s"], 300);
  EXPECT_FALSE(r->contains("egress_profile"));  // no `open` here: `none`, not asked for
  auto off = TranslateCreate(json::parse(R"({"templateID":"t","allow_internet_access":false})"),
                             kWithOpen);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->contains("egress_profile"));
  // The Python SDK sends true by default: where `open` is not offered the sandbox is offline
  // (getInfo says allowInternetAccess false), not refused.
  auto on = TranslateCreate(json::parse(R"({"templateID":"t","allow_internet_access":true})"),
                            kNoneOnly);
  ASSERT_TRUE(on.ok());
  EXPECT_FALSE(on->contains("egress_profile"));
}

TEST(TranslateCreate, WhatSbxCannotDoIsRefusedByName) {
  for (const char* body :
       {R"({"templateID":"t","autoPause":true})", R"({"templateID":"t","network":{"allowOut":["1.1.1.1"]}})",
        R"({"templateID":"t","volumeMounts":[{"name":"v","path":"/v"}]})",
        R"({"templateID":"t","bogus":1})", R"({"templateID":3})", R"({})"}) {
    auto r = TranslateCreate(json::parse(body), kWithOpen);
    EXPECT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
  auto pub = TranslateCreate(
      json::parse(R"({"templateID":"t","network":{"allowPublicTraffic":true,"allowOut":[]}})"),
      kWithOpen);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ((*pub)["public_ports"], true);
}

TEST(E2bErrors, StatusesTheSdksReadAsMeanings) {
  const auto gone = ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running", "x");
  EXPECT_EQ(RestStatusFor(gone, Side::kEnvd), 502u);
  EXPECT_EQ(RestStatusFor(ApiError(absl::StatusCode::kNotFound, "not_found", "x"),
                          Side::kControlPlane),
            404u);
  EXPECT_EQ(RestStatusFor(ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_expired", "x"),
                          Side::kControlPlane),
            404u);
  EXPECT_EQ(RestStatusFor(ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated", "x"),
                          Side::kControlPlane),
            401u);
}

}  // namespace
}  // namespace sbx::api::e2b
