#include "net/profiles.h"

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

using Json = nlohmann::json;

ProfileCatalog Catalog() {
  auto c = ProfileCatalog::FromJson(Json::parse(R"({
      "pypi_mirror": {"description": "the lab mirror",
                      "allow": [{"cidr": "198.18.0.0/24", "ports": "443", "protocol": "tcp"}]},
      "lab": {"allow": [{"cidr": "198.18.0.0/15"}], "deny": [{"cidr": "198.18.9.0/24"}]}})"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

TEST(ProfileCatalog, ListsBuiltinsThenConfiguredByName) {
  Json j = Catalog().ToJson();
  ASSERT_EQ(j["egress_profiles"].size(), 4u);
  EXPECT_EQ(j["egress_profiles"][0]["name"], "none");
  EXPECT_EQ(j["egress_profiles"][0]["rules"], Json::array());
  EXPECT_EQ(j["egress_profiles"][1]["name"], "open");
  EXPECT_EQ(j["egress_profiles"][2]["name"], "lab");
  EXPECT_EQ(j["egress_profiles"][3]["name"], "pypi_mirror");
  EXPECT_EQ(j["egress_profiles"][3]["description"], "the lab mirror");
  EXPECT_EQ(j["egress_profiles"][3]["rules"][0]["ports"], "443");
}

TEST(ProfileCatalog, ResolvesProfileAndNarrowing) {
  ProfileCatalog c = Catalog();
  auto none = c.Resolve("none", nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->networked);
  auto lab = c.Resolve("lab", Json::parse(R"({"allow":[{"cidr":"198.18.1.0/24","ports":80}]})"));
  ASSERT_TRUE(lab.ok()) << lab.status();
  EXPECT_TRUE(lab->networked);
  ASSERT_TRUE(lab->narrowed.has_value());
  EXPECT_EQ(lab->policy().profile, "lab");
  auto back = ResolvedEgress::FromJson(lab->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), lab->ToJson());

  auto unknown = c.Resolve("nope", nullptr);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("egress_profile: unknown profile 'nope' (available: "
                                            "none, open, lab, pypi_mirror)"),
            std::string::npos)
      << unknown.status();
  auto widen = c.Resolve("pypi_mirror", Json::parse(R"({"allow":[{"cidr":"198.18.0.0/24"}]})"));
  ASSERT_FALSE(widen.ok());
  EXPECT_NE(widen.status().message().find("egress.allow[0]"), std::string::npos);
  EXPECT_FALSE(c.Resolve("none", Json::parse(R"({"allow":[]})")).ok());
}

TEST(ProfileCatalog, ConfigurationErrorsNameTheProfile) {
  auto empty = ProfileCatalog::FromJson(Json::parse(R"({"x": {"allow": []}})"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("egress.profiles.x.allow"), std::string::npos);
  auto domain = ProfileCatalog::FromJson(Json::parse(R"({"pkgs": {"allow": [{"domain": "pypi.org", "protocol": "udp"}]}})"));
  ASSERT_FALSE(domain.ok());
  EXPECT_NE(domain.status().message().find("egress.profiles.pkgs.allow[0].protocol"), std::string::npos);
  EXPECT_FALSE(ProfileCatalog::FromJson(Json::parse(R"({"open": {"allow": [{"cidr": "::/0"}]}})")).ok());
  EXPECT_FALSE(ProfileCatalog::FromJson(Json::parse(R"([1])")).ok());
  EXPECT_TRUE(ProfileCatalog::FromJson(nullptr).ok());
}

}  // namespace
}  // namespace sbx::net
