#include "daemon/templates_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sbx::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RegistryAuth, DockerConfigFormsAreRead) {
  // "dXNlcjpwYTpzcw==" is base64 of "user:pa:ss": the password may hold ':'.
  auto m = ParseRegistryAuth(R"({"auths": {
      "https://index.docker.io/v1/": {"auth": "dXNlcjpwYTpzcw=="},
      "127.0.0.1:5000": {"username": "alice", "password": "s3cret"}}})",
                             "f.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->at("registry-1.docker.io").username, "user");
  EXPECT_EQ(m->at("registry-1.docker.io").password, "pa:ss");
  EXPECT_EQ(m->at("127.0.0.1:5000").username, "alice");
  EXPECT_EQ(m->at("127.0.0.1:5000").password, "s3cret");
}

TEST(RegistryAuth, BadFilesNameTheEntryButNeverTheSecret) {
  for (const char* bad : {"", "[]", "{}", R"({"auths": []})", R"({"auths": {"h": 1}})",
                          R"({"auths": {"h": {"auth": "!!!"}}})",
                          R"({"auths": {"h": {"auth": "bm9jb2xvbg=="}}})",
                          R"({"auths": {"h": {"password": "topsecret"}}})"}) {
    auto m = ParseRegistryAuth(bad, "f.json");
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("f.json")) << bad;
    EXPECT_THAT(std::string(m.status().message()), Not(HasSubstr("topsecret"))) << bad;
  }
}

TEST(RegistryAuth, InsecureHostsAndTheCaFileApplyToEveryRegistry) {
  Config c;
  c.templates.registry_insecure = "127.0.0.1:5000, lab.example:443";
  c.templates.registry_ca_file = "/etc/ssl/lab.pem";
  auto m = RegistryCredentials(c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->at("127.0.0.1:5000").insecure);
  EXPECT_TRUE(m->at("lab.example:443").insecure);
  EXPECT_EQ(m->at("lab.example:443").ca_file, "/etc/ssl/lab.pem");
  EXPECT_EQ(m->at("").ca_file, "/etc/ssl/lab.pem");
  c.templates.registry_auth_file = "/nonexistent/auth.json";
  auto missing = RegistryCredentials(c);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("templates.registry_auth_file"));
}

}  // namespace
}  // namespace sbx::daemon
