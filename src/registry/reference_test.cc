// Image references as Docker reads them: registry, repository, tag and digest defaults.
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
                          "a b", "a:t@md5:x", "host:5000/", "a\nb", "a/.b", "a-/b", "reg.example/_x"}) {
    auto r = ParseReference(bad);
    EXPECT_FALSE(r.ok()) << "accepted \"" << bad << "\"";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    }
  }
}

TEST(Reference, DigestsAndDefaults) {
  const std::string d = "sha256:" + std::string(64, 'a');
  auto hub = ParseReference("busybox@" + d);
  ASSERT_TRUE(hub.ok()) << hub.status();
  EXPECT_EQ(hub->registry, "registry-1.docker.io");
  EXPECT_EQ(hub->repository, "library/busybox");
  EXPECT_EQ(hub->digest, d);
  EXPECT_EQ(hub->tag, "");
  // A tag beside a digest says nothing more: the digest pins the image.
  auto both = ParseReference("localhost:5000/a/b:v1@" + d);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->registry, "localhost:5000");
  EXPECT_EQ(both->repository, "a/b");
  EXPECT_EQ(both->tag, "");
  EXPECT_EQ(both->digest, d);
  // Mixed-case tags are Docker's, upper-case digests are not.
  auto mixed = ParseReference("reg.example/a:V1.2-rc_3");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->tag, "V1.2-rc_3");
  EXPECT_FALSE(ParseReference("a@sha256:" + std::string(64, 'A')).ok());
  EXPECT_FALSE(ParseReference("a@sha256:" + std::string(63, 'a')).ok());
  EXPECT_FALSE(ParseReference("a@sha512:" + std::string(64, 'a')).ok());
  EXPECT_FALSE(ParseReference("a:" + std::string(129, 't')).ok());
}

TEST(Reference, StringParsesBack) {
  for (const char* text : {"busybox", "team/app:1.2", "127.0.0.1:5000/team/app",
                           "localhost/x:y", "registry.example/a/b/c:v1"}) {
    auto r = ParseReference(text);
    ASSERT_TRUE(r.ok()) << text;
    auto again = ParseReference(r->String());
    ASSERT_TRUE(again.ok()) << r->String();
    EXPECT_EQ(again->registry, r->registry);
    EXPECT_EQ(again->repository, r->repository);
    EXPECT_EQ(again->tag, r->tag);
    EXPECT_EQ(again->digest, r->digest);
  }
  auto r = ParseReference("busybox");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->String(), "registry-1.docker.io/library/busybox:latest");
}

TEST(Reference, ErrorsNameTheProblem) {
  auto r = ParseReference("a@sha256:zz");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("digest"), std::string_view::npos) << r.status();
  r = ParseReference("a:-x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tag"), std::string_view::npos) << r.status();
  r = ParseReference("Team/App");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("repository"), std::string_view::npos) << r.status();
}

}  // namespace
}  // namespace sbx::registry
