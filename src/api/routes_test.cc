#include "api/routes.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

namespace sbx::api {
namespace {

std::vector<std::string> Segs(std::initializer_list<const char*> s) { return {s.begin(), s.end()}; }

TEST(Routes, PatternMatches) {
  EXPECT_TRUE(PatternMatches("healthz", Segs({"healthz"})));
  EXPECT_FALSE(PatternMatches("healthz", Segs({})));
  EXPECT_FALSE(PatternMatches("healthz", Segs({"healthz", "x"})));
  EXPECT_TRUE(PatternMatches("v1/sandboxes/{id}", Segs({"v1", "sandboxes", "anything"})));
  EXPECT_FALSE(PatternMatches("v1/sandboxes/{id}", Segs({"v1", "sandboxes"})));
  EXPECT_FALSE(PatternMatches("v1/sandboxes/{id}", Segs({"v1", "sessions", "x"})));
  EXPECT_TRUE(PatternMatches("v1/sandboxes/{id}/files*", Segs({"v1", "sandboxes", "x", "files"})));
  EXPECT_TRUE(
      PatternMatches("v1/sandboxes/{id}/files*", Segs({"v1", "sandboxes", "x", "files:list"})));
  EXPECT_FALSE(
      PatternMatches("v1/sandboxes/{id}/files*", Segs({"v1", "sandboxes", "x", "file"})));
  EXPECT_FALSE(PatternMatches("v1/sessions/{id}/stdin", Segs({"v1", "sessions", "x", "stdin:close"})));
}

TEST(Routes, TableIsConsistent) {
  std::set<std::pair<std::string_view, int>> seen;
  std::map<std::string_view, Auth> auth;
  for (const Route& r : RouteTable()) {
    const int method = r.method ? static_cast<int>(*r.method) : -1;
    EXPECT_TRUE(seen.insert({r.pattern, method}).second) << r.pattern << " twice";
    // One pattern, one way to authenticate: it is decided before the method is looked at.
    auto [it, fresh] = auth.emplace(r.pattern, r.auth);
    EXPECT_EQ(it->second, r.auth) << r.pattern;
    EXPECT_NE(r.handler, nullptr) << r.pattern;
    // Every authenticated route names the scopes that allow it; a GET of the tenant's objects
    // needs read (or, for a session's data plane, sessions), anything else a scope that may
    // change them, and /v1/admin the admin scope alone.
    const bool authenticated = r.auth == Auth::kTenant || r.auth == Auth::kSession;
    EXPECT_EQ(r.scopes != 0, authenticated) << r.pattern;
    const uint32_t admin = static_cast<uint32_t>(service::Scope::kAdmin);
    const uint32_t read = static_cast<uint32_t>(service::Scope::kRead);
    const uint32_t sessions = static_cast<uint32_t>(service::Scope::kSessions);
    if (std::string_view(r.pattern).rfind("v1/admin/", 0) == 0) {
      EXPECT_EQ(r.scopes, admin) << r.pattern;
    } else if (authenticated) {
      EXPECT_EQ(r.scopes & admin, 0u) << r.pattern << ": admin implies every scope already";
      if (r.method && *r.method != http::bhttp::verb::get) {
        EXPECT_EQ(r.scopes & read, 0u) << r.pattern << ": read must not allow a change";
      }
      if (r.auth == Auth::kSession) EXPECT_EQ(r.scopes, sessions) << r.pattern;
    }
  }
  // The session's data plane, and only it, takes the attach token.
  for (const auto& [pattern, a] : auth) {
    const bool data_plane = pattern.rfind("v1/sessions/{id}/", 0) == 0;
    EXPECT_EQ(a == Auth::kSession, data_plane) << pattern;
  }
}

}  // namespace
}  // namespace sbx::api
