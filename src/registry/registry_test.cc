#include "registry/challenge.h"
#include "registry/registry.h"

#include <gtest/gtest.h>

namespace sbx::registry {
namespace {

TEST(Reference, DockerFormsParse) {
  struct Case {
    const char* text;
    const char* registry;
    const char* repository;
    const char* tag;
  } cases[] = {
      {"busybox", "registry-1.docker.io", "library/busybox", "latest"},
      {"team/app:1.2", "registry-1.docker.io", "team/app", "1.2"},
      {"docker.io/library/python:3.12", "registry-1.docker.io", "library/python", "3.12"},
      {"127.0.0.1:5000/team/app", "127.0.0.1:5000", "team/app", "latest"},
      {"localhost/x:y", "localhost", "x", "y"},
      {"registry.example/a/b/c:v1", "registry.example", "a/b/c", "v1"},
  };
  for (const auto& c : cases) {
    auto r = ParseReference(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status();
    EXPECT_EQ(r->registry, c.registry) << c.text;
    EXPECT_EQ(r->repository, c.repository) << c.text;
    EXPECT_EQ(r->tag, c.tag) << c.text;
  }
  const std::string d = "sha256:" + std::string(64, 'b');
  auto r = ParseReference("127.0.0.1:5000/app@" + d);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->digest, d);
  EXPECT_EQ(r->tag, "");
  EXPECT_EQ(r->String(), "127.0.0.1:5000/app@" + d);
}

TEST(Reference, BadOnesSayWhy) {
  for (const char* bad : {"", "UPPER/case", "a//b", "/a", "a/", "a:", "a:-x", "a@sha256:zz",
                          "a b", "a:t@md5:x", "host:5000/", "a\nb"}) {
    auto r = ParseReference(bad);
    EXPECT_FALSE(r.ok()) << "accepted \"" << bad << "\"";
    if (!r.ok()) EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Challenge, BearerParametersParseAndJunkIsDropped) {
  auto p = ParseChallengeParams(
      R"(Realm="https://auth.example/token",service="reg \"x\"",scope=repository:a:pull)");
  EXPECT_EQ(p["realm"], "https://auth.example/token");
  EXPECT_EQ(p["service"], "reg \"x\"");
  EXPECT_EQ(p["scope"], "repository:a:pull");
  EXPECT_TRUE(ParseChallengeParams("no equals here").empty());
  EXPECT_EQ(ParseChallengeParams(R"(realm="unterminated)")["realm"], "unterminated");
}

}  // namespace
}  // namespace sbx::registry
