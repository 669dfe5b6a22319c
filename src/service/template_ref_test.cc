#include "service/template_ref.h"

#include <gtest/gtest.h>

namespace sbx::service {
namespace {

TEST(TemplateRefTest, FormsParse) {
  auto r = ParseTemplateRef("base");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "base");
  EXPECT_EQ(r->tag, "latest");
  EXPECT_EQ(r->String(), "base:latest");
  r = ParseTemplateRef("team.py-3.12:v1.0_rc-2");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "team.py-3.12");
  EXPECT_EQ(r->tag, "v1.0_rc-2");
  const std::string d = "sha256:" + std::string(64, 'a');
  r = ParseTemplateRef("py@" + d);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->digest, d);
  EXPECT_EQ(r->tag, "");
  EXPECT_EQ(r->String(), "py@" + d);
}

TEST(TemplateRefTest, BadRefsNameWhatIsWrong) {
  for (const char* bad :
       {"", ":", "py:", ":tag", "Py", "py/", "/py", "py//x", "-py", "py-", "py:.x", "py:-x",
        "py:a b", "py@sha256:abc", "py@md5:" , "py@", "p y", "py\n", "../etc", "py:x:y", "team/py"}) {
    auto r = ParseTemplateRef(bad);
    EXPECT_FALSE(r.ok()) << "accepted \"" << bad << "\"";
    if (!r.ok()) EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ParseTemplateRef(std::string(129, 'a')).ok());
  EXPECT_TRUE(ParseTemplateRef(std::string(128, 'a')).ok());
  EXPECT_FALSE(ParseTemplateRef("py:" + std::string(129, 'a')).ok());
  EXPECT_FALSE(ParseTemplateRef("py@sha256:" + std::string(64, 'A')).ok());
}

TEST(TemplateRefTest, QualifiedNamesSplitBackAndNeverParseAsRefs) {
  EXPECT_EQ(QualifiedTemplateName("", "py"), "py");
  EXPECT_EQ(QualifiedTemplateName("ten_abc", "py"), "ten_abc/py");
  auto s = SplitTemplateName("ten_abc/py");
  EXPECT_EQ(s.ns, "ten_abc");
  EXPECT_EQ(s.name, "py");
  s = SplitTemplateName("py");
  EXPECT_EQ(s.ns, "");
  EXPECT_EQ(s.name, "py");
  // A client cannot name another tenant's template by writing its stored form.
  EXPECT_FALSE(ParseTemplateRef(QualifiedTemplateName("ten_abc", "py")).ok());
  EXPECT_FALSE(ParseTemplateRef("ten_abc/py:latest").ok());
}

}  // namespace
}  // namespace sbx::service
