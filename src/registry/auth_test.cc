// The network-free pieces of registry auth: challenges, basic credentials, token answers and
// error bodies, as registries (distribution, Docker Hub, GHCR, Harbor) send them.
#include "registry/auth.h"

#include <gtest/gtest.h>

namespace sbx::registry {
namespace {

TEST(Auth, BearerChallengeParses) {
  Challenge c = ParseChallenge(
      R"(Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull")");
  EXPECT_EQ(c.scheme, "bearer");
  EXPECT_EQ(c.params["realm"], "https://auth.docker.io/token");
  EXPECT_EQ(c.params["service"], "registry.docker.io");
  EXPECT_EQ(c.params["scope"], "repository:library/busybox:pull");
  c = ParseChallenge(R"(BASIC Realm="a \"quoted\" realm", charset=UTF-8)");
  EXPECT_EQ(c.scheme, "basic");
  EXPECT_EQ(c.params["realm"], "a \"quoted\" realm");
  EXPECT_EQ(c.params["charset"], "UTF-8");
  // Garbage gives a scheme and nothing else, never a crash.
  for (const char* junk : {"", " ", "Bearer", "Bearer =", "Bearer realm=\"open", "x ,,,=\""}) {
    c = ParseChallenge(junk);
    EXPECT_LE(c.params.size(), 1u) << junk;
  }
}

TEST(Auth, BasicHeader) {
  EXPECT_EQ(BasicAuthorization("user", "pass"), "Authorization: Basic dXNlcjpwYXNz");
}

TEST(Auth, TokenAnswers) {
  EXPECT_EQ(*TokenFromAnswer(R"({"token":"abc","expires_in":300})"), "abc");
  EXPECT_EQ(*TokenFromAnswer(R"({"access_token":"xyz"})"), "xyz");
  EXPECT_EQ(*TokenFromAnswer(R"({"token":"","access_token":"xyz"})"), "xyz");
  for (const char* bad : {"", "[]", "{}", R"({"token":1})", R"({"token":"a\r\nX-Evil: 1"})",
                          R"({"token":"a b"})", "{\"token\":"}) {
    auto t = TokenFromAnswer(bad);
    EXPECT_FALSE(t.ok()) << bad;
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kUnauthenticated) << bad;
    }
  }
  EXPECT_FALSE(TokenFromAnswer("{\"token\":\"" + std::string(20000, 'a') + "\"}").ok());
}

TEST(Auth, RegistryErrorDetail) {
  EXPECT_EQ(RegistryErrorDetail(
                R"({"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]})"),
            ": MANIFEST_UNKNOWN manifest unknown");
  for (const char* none : {"", "not json", "{}", R"({"errors":[]})", R"({"errors":[1]})",
                           R"({"errors":{"code":"X"}})"}) {
    EXPECT_EQ(RegistryErrorDetail(none), "") << none;
  }
  EXPECT_EQ(RegistryErrorDetail(R"({"errors":[{"code":7}]})"), ":  ");
}

}  // namespace
}  // namespace sbx::registry
