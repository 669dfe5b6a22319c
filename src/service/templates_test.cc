#include "service/templates.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx::service {
namespace {

namespace fs = std::filesystem;

std::string D(char c) { return "sha256:" + std::string(64, c); }

runtime::TemplateSpec Spec(const std::string& name, const std::string& digest) {
  runtime::TemplateSpec s;
  s.name = name;
  s.digest = digest;
  return s;
}

class TemplateRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-templates-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto r = TemplateRegistry::Create(dir_.string());
    ASSERT_TRUE(r.ok()) << r.status();
    reg_.emplace(std::move(*r));
    // Three "py"s: tenant a's, the shared one, tenant b's; and a name only b has.
    reg_->AddImage(Spec("ten_a/py", D('a')));
    reg_->AddImage(Spec("py", D('5')));
    reg_->AddImage(Spec("ten_b/py", D('b')));
    reg_->AddImage(Spec("ten_b/secret", D('c')));
    reg_->SetTag("ten_a/py", "latest", D('a'));
    reg_->SetTag("py", "latest", D('5'));
    reg_->SetTag("ten_b/py", "latest", D('b'));
    reg_->SetTag("ten_b/secret", "1", D('c'));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string DigestOf(const std::string& ref, const std::string& ns) {
    auto r = reg_->Resolve(ref, ns);
    return r.ok() ? r->digest : "error: " + std::string(r.status().message());
  }

  fs::path dir_;
  std::optional<TemplateRegistry> reg_;
};

TEST_F(TemplateRegistryTest, ANamespaceSeesItsOwnFirstThenTheSharedOnes) {
  EXPECT_EQ(DigestOf("py", "ten_a"), D('a'));
  EXPECT_EQ(DigestOf("py:latest", "ten_b"), D('b'));
  EXPECT_EQ(DigestOf("py", "ten_c"), D('5'));  // nothing of its own: the shared one
  EXPECT_EQ(DigestOf("py", ""), D('5'));
  EXPECT_EQ(DigestOf("secret:1", "ten_b"), D('c'));
  EXPECT_EQ(DigestOf("base", "ten_a"), reg_->base_digest());
  // By digest: only a release made or tagged under a name the caller sees.
  EXPECT_EQ(DigestOf("py@" + D('a'), "ten_a"), D('a'));
  EXPECT_EQ(DigestOf("py@" + D('5'), "ten_a"), D('5'));
  EXPECT_EQ(DigestOf("py@" + D('b'), "ten_b"), D('b'));
}

TEST_F(TemplateRegistryTest, AnotherNamespacesTemplateIsNotFoundAndNotListed) {
  for (const auto& [ref, ns] : std::vector<std::pair<std::string, std::string>>{
           {"secret:1", "ten_a"},          {"secret:1", ""},
           {"py@" + D('b'), "ten_a"},      {"py@" + D('a'), ""},
           {"secret@" + D('c'), "ten_a"},  {"py@" + D('c'), "ten_b"}}) {
    auto r = reg_->Resolve(ref, ns);
    ASSERT_FALSE(r.ok()) << ref << " in " << ns;
    EXPECT_EQ(ApiErrorCode(r.status()), "template_not_found") << r.status();
    const std::string msg(r.status().message());
    // Its list of names holds what the caller sees: never a qualifier, never b's names.
    const std::string listed = msg.substr(msg.find("available:") == std::string::npos
                                              ? 0
                                              : msg.find("available:"));
    EXPECT_EQ(listed.find("ten_"), std::string::npos) << msg;
    if (ns != "ten_b") {
      EXPECT_EQ(listed.find("secret"), std::string::npos) << msg;
    }
  }
  // The stored form is not a name a client can write.
  for (const char* ns : {"ten_a", "ten_b", ""}) {
    auto r = reg_->Resolve("ten_b/secret:1", ns);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(ApiErrorCode(r.status()), "invalid_template_ref") << r.status();
  }
  auto r = reg_->Resolve("nope", "ten_b");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ApiErrorCode(r.status()), "template_not_found");
  EXPECT_NE(std::string(r.status().message()).find("secret:1"), std::string::npos) << r.status();
}

TEST_F(TemplateRegistryTest, ReplaceTagChangesOnlyWhatItWasToldItFound) {
  // Followed: the tag still names what the caller read.
  EXPECT_TRUE(reg_->ReplaceTag("py", "latest", D('5'), D('a')));
  EXPECT_EQ(reg_->TagDigest("py", "latest"), D('a'));
  // Moved meanwhile (the caller read '5'): left alone.
  EXPECT_FALSE(reg_->ReplaceTag("py", "latest", D('5'), ""));
  EXPECT_EQ(reg_->TagDigest("py", "latest"), D('a'));
  // Removed, then added where the caller saw none; a second add finds one and does nothing.
  EXPECT_TRUE(reg_->ReplaceTag("py", "latest", D('a'), ""));
  EXPECT_EQ(reg_->TagDigest("py", "latest"), "");
  EXPECT_TRUE(reg_->ReplaceTag("py", "v2", "", D('5')));
  EXPECT_FALSE(reg_->ReplaceTag("py", "v2", "", D('a')));
  EXPECT_EQ(reg_->TagDigest("py", "v2"), D('5'));
  EXPECT_TRUE(reg_->HoldsRelease(D('5')));
  EXPECT_FALSE(reg_->HoldsRelease(D('9')));
}

}  // namespace
}  // namespace sbx::service
