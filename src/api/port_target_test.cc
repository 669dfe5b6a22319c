#include "api/port_target.h"

#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx::api {
namespace {

TEST(PortTargetTest, PathFormGivesTheRestAndTheQuery) {
  auto m = MatchPortPath("/v1/sandboxes/sbx_abc/ports/8080/a/b?x=1");
  ASSERT_TRUE(m && m->ok());
  EXPECT_EQ((*m)->sandbox_id, "sbx_abc");
  EXPECT_EQ((*m)->port, 8080);
  EXPECT_EQ((*m)->upstream_target, "/a/b?x=1");
  auto bare = MatchPortPath("/v1/sandboxes/sbx_abc/ports/80");
  ASSERT_TRUE(bare && bare->ok());
  EXPECT_EQ((*bare)->upstream_target, "/");
  auto query = MatchPortPath("/v1/sandboxes/sbx_abc/ports/80?q");
  ASSERT_TRUE(query && query->ok());
  EXPECT_EQ((*query)->upstream_target, "/?q");
}

TEST(PortTargetTest, OtherPathsAreNotPortRequests) {
  EXPECT_FALSE(MatchPortPath("/v1/sandboxes/sbx_abc"));
  EXPECT_FALSE(MatchPortPath("/v1/sandboxes/sbx_abc/files"));
  EXPECT_FALSE(MatchPortPath("/v1/sandboxes/sbx_abc/ports"));
  EXPECT_FALSE(MatchPortPath("/v1/sandboxes?x=/ports/1"));
}

TEST(PortTargetTest, BadPortsNameTheField) {
  for (const char* p : {"0", "65536", "-1", "08", "abc", "", "99999999999"}) {
    auto m = MatchPortPath(std::string("/v1/sandboxes/sbx_abc/ports/") + p + "/x");
    ASSERT_TRUE(m) << p;
    ASSERT_FALSE(m->ok()) << p;
    EXPECT_EQ(ApiErrorField(m->status()), "port") << p;
  }
  EXPECT_TRUE(ParsePortNumber("65535").ok());
  EXPECT_TRUE(ParsePortNumber("1").ok());
}

TEST(PortTargetTest, HostForm) {
  auto m = MatchPortHost("8080-SBX_ABC.Sbx.Example:7070", "/p?q", "sbx.example");
  ASSERT_TRUE(m && m->ok());
  EXPECT_EQ((*m)->sandbox_id, "sbx_abc");
  EXPECT_EQ((*m)->port, 8080);
  EXPECT_EQ((*m)->upstream_target, "/p?q");
  EXPECT_TRUE((*m)->by_host);
  // The id's `_` may come as `-`, the only form a wildcard certificate covers.
  auto dashed = MatchPortHost("8080-sbx-abc.sbx.example", "/", "sbx.example");
  ASSERT_TRUE(dashed && dashed->ok());
  EXPECT_EQ((*dashed)->sandbox_id, "sbx_abc");
  EXPECT_EQ((*dashed)->port, 8080);
  EXPECT_FALSE(MatchPortHost("8080-sbx_abc.sbx.example", "/", ""));
  EXPECT_FALSE(MatchPortHost("sbx.example", "/", "sbx.example"));
  EXPECT_FALSE(MatchPortHost("8080-sbx_abc.evilsbx.example", "/", "sbx.example"));
  auto bad = MatchPortHost("x.y.sbx.example", "/", "sbx.example");
  ASSERT_TRUE(bad);
  EXPECT_FALSE(bad->ok());
  auto badport = MatchPortHost("70000-sbx_abc.sbx.example", "/", "sbx.example");
  ASSERT_TRUE(badport && !badport->ok());
  EXPECT_EQ(ApiErrorField(badport->status()), "port");
}

TEST(PortTargetTest, UpstreamHeadStripsCredentialsAndHopByHop) {
  http::Request req{http::bhttp::verb::post, "/v1/sandboxes/x/ports/1/a", 11};
  req.set(http::bhttp::field::host, "h");
  req.set(http::bhttp::field::authorization, "Bearer admin");
  req.set("X-Sbx-Traffic-Token", "stt1.secret");
  req.set("E2b-Traffic-Access-Token", "stt1.secret");
  req.set(http::bhttp::field::connection, "keep-alive");
  req.set(http::bhttp::field::transfer_encoding, "chunked");
  req.set("X-Forwarded-For", "6.6.6.6");
  req.set("X-Forwarded-Proto", "gopher");
  req.set("X-App", "1");
  UpstreamHeadOptions o;
  o.strip_authorization = true;
  o.has_body = true;
  o.forwarded_for = "127.0.0.1";
  o.forwarded_proto = "https";
  const std::string head = UpstreamHead(req, "/a", o);
  EXPECT_EQ(head.rfind("POST /a HTTP/1.1\r\n", 0), 0u) << head;
  EXPECT_EQ(head.find("secret"), std::string::npos) << head;
  EXPECT_EQ(head.find("admin"), std::string::npos) << head;
  EXPECT_EQ(head.find("keep-alive"), std::string::npos) << head;
  EXPECT_EQ(head.find("6.6.6.6"), std::string::npos) << head;
  EXPECT_NE(head.find("X-App: 1\r\n"), std::string::npos) << head;
  // sbxd keeps its connection to the server alive whatever the client asked of its own.
  EXPECT_EQ(head.find("Connection:"), std::string::npos) << head;
  EXPECT_NE(head.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("X-Forwarded-For: 127.0.0.1\r\n"), std::string::npos) << head;
  // The scheme is sbxd's word too: a client's own claim does not reach the server.
  EXPECT_EQ(head.find("gopher"), std::string::npos) << head;
  EXPECT_NE(head.find("X-Forwarded-Proto: https\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");
  // Another Authorization is the application's own.
  o.strip_authorization = false;
  EXPECT_NE(UpstreamHead(req, "/a", o).find("Bearer admin"), std::string::npos);
  req.set(http::bhttp::field::connection, "close");
  EXPECT_EQ(UpstreamHead(req, "/a", o).find("close"), std::string::npos);
}

TEST(PortTargetTest, UpstreamHeadStripsTheEnvdTokenOfE2bRequests) {
  http::Request req{http::bhttp::verb::get, "/execute", 11};
  req.set("X-Access-Token", "set1.secret");
  UpstreamHeadOptions o;
  // Outside the E2B gateway an X-Access-Token is the application's own header.
  EXPECT_NE(UpstreamHead(req, "/execute", o).find("set1.secret"), std::string::npos);
  o.strip_access_token = true;
  EXPECT_EQ(UpstreamHead(req, "/execute", o).find("set1.secret"), std::string::npos);
}

}  // namespace
}  // namespace sbx::api
