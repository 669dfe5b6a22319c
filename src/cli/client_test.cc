#include "cli/client.h"

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <boost/asio.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli_common.h"

namespace sbx::cli {
namespace {

using ::testing::HasSubstr;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

TEST(ParseUrl, Accepts) {
  auto e = ParseUrl("http://127.0.0.1:7070");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, "7070");
  EXPECT_EQ(e->base_path, "");
  e = ParseUrl("HTTP://example.org/prefix/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->port, "80");
  EXPECT_EQ(e->base_path, "/prefix");
  EXPECT_EQ(e->url, "HTTP://example.org/prefix");
  e = ParseUrl("http://[::1]:9/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, "9");
  EXPECT_FALSE(e->https());
  e = ParseUrl("HTTPS://sbx.example.org");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->https());
  EXPECT_EQ(e->port, "443");
}

TEST(ParseUrl, Rejects) {
  for (const char* bad : {"127.0.0.1:7070", "ftp://x", "http://", "http://x:0", "http://x:99999",
                          "http://x:a", "http://u:p@x", "http://x/?q", "http://[::1"}) {
    EXPECT_FALSE(ParseUrl(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseUrl("ftp://x").status().message()),
              HasSubstr("only http:// and https://"));
}

TEST(UrlEncode, Encodes) {
  EXPECT_EQ(UrlEncode("team=a b/c"), "team%3Da%20b%2Fc");
  EXPECT_EQ(UrlEncode("A-z_0.~"), "A-z_0.~");
}

TEST(DecodeHttpError, ApiErrorShape) {
  absl::Status s = DecodeHttpError(
      404,
      R"({"error":{"code":"not_found","message":"sandbox sbx_x not found","request_id":"req_1"}})",
      "req_header");
  EXPECT_TRUE(absl::IsNotFound(s));
  EXPECT_EQ(s.message(), "404 not_found: sandbox sbx_x not found (request req_1)");
  s = DecodeHttpError(
      400,
      R"({"error":{"code":"invalid_argument","message":"out of range","request_id":"r","details":{"field":"resources.vcpu"}}})",
      "");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "400 invalid_argument: out of range (field resources.vcpu, request r)");
}

TEST(DecodeHttpError, NonJsonBody) {
  absl::Status s = DecodeHttpError(502, "bad gateway\nfrom proxy", "req_9");
  EXPECT_EQ(s.message(), "502 Bad Gateway: bad gateway from proxy (request req_9)");
  s = DecodeHttpError(503, "", "");
  EXPECT_TRUE(absl::IsUnavailable(s));
  EXPECT_EQ(s.message(), "503 Service Unavailable");
}

TEST(CliCommon, KeyValues) {
  auto kv = ParseKeyValues({"A=1", "B=x=y", "C="}, "--env");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->at("B"), "x=y");
  EXPECT_EQ(kv->at("C"), "");
  EXPECT_FALSE(ParseKeyValues({"novalue"}, "--env").ok());
  EXPECT_FALSE(ParseKeyValues({"=v"}, "--env").ok());
}

TEST(CliCommon, Ids) {
  EXPECT_TRUE(CheckId("sbx_abc234", "sbx").ok());
  EXPECT_FALSE(CheckId("sbx_", "sbx").ok());
  EXPECT_FALSE(CheckId("op_abc", "sbx").ok());
  EXPECT_FALSE(CheckId("sbx_../x", "sbx").ok());
  EXPECT_FALSE(CheckId("sbx_a?b", "sbx").ok());
}

TEST(CliCommon, Signals) {
  EXPECT_EQ(SignalNumber("SIGKILL"), 9);
  EXPECT_EQ(SignalNumber("TERM"), 15);
  EXPECT_EQ(SignalNumber("2"), 2);
  EXPECT_EQ(SignalNumber("SIGNOPE"), 0);
}

// A one-connection-at-a-time loopback server whose replies the test scripts.
class FakeServer {
 public:
  using Script = std::function<void(tcp::socket&, const std::string& request)>;
  explicit FakeServer(Script script) : acceptor_(ioc_, {asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this, script = std::move(script)] {
      boost::system::error_code ec;
      tcp::socket s(ioc_);
      acceptor_.accept(s, ec);
      if (ec) return;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        size_t n = s.read_some(asio::buffer(buf), ec);
        if (ec) return;
        req.append(buf, n);
      }
      script(s, req);
      s.shutdown(tcp::socket::shutdown_both, ec);
    });
  }
  ~FakeServer() {
    boost::system::error_code ec;
    acceptor_.close(ec);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_;
  std::thread thread_;
};

void Send(tcp::socket& s, std::string_view data) {
  asio::write(s, asio::buffer(data.data(), data.size()));
}

std::string Chunk(std::string_view data) {
  char size[32];
  snprintf(size, sizeof size, "%zx\r\n", data.size());
  return std::string(size) + std::string(data) + "\r\n";
}

TEST(Client, ConnectionRefused) {
  // Bind then close to get a port nobody listens on.
  asio::io_context ioc;
  tcp::acceptor a(ioc, {asio::ip::make_address("127.0.0.1"), 0});
  std::string url = "http://127.0.0.1:" + std::to_string(a.local_endpoint().port());
  a.close();
  Client c(*ParseUrl(url), "t");
  auto r = c.Get("/v1/sandboxes");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "cannot reach sbxd at " + url + ": Connection refused");
}

TEST(Client, JsonRequestAndError) {
  std::string seen;
  FakeServer server([&](tcp::socket& s, const std::string& req) {
    seen = req;
    std::string body =
        R"({"error":{"code":"not_found","message":"sandbox sbx_x not found","request_id":"req_a"}})";
    Send(s, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nX-Request-Id: req_a\r\n"
            "Connection: close\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  Client c(*ParseUrl(server.url()), "secret");
  auto r = c.Get("/v1/sandboxes/sbx_x");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_EQ(r.status().message(), "404 not_found: sandbox sbx_x not found (request req_a)");
  EXPECT_THAT(seen, HasSubstr("GET /v1/sandboxes/sbx_x HTTP/1.1\r\n"));
  EXPECT_THAT(seen, HasSubstr("Authorization: Bearer secret\r\n"));
}

TEST(Client, StreamDeliversEventsBeforeTheResponseEnds) {
  std::promise<void> first_seen;
  auto first_seen_future = first_seen.get_future();
  std::atomic<bool> delivered_early{false};
  std::string seen;
  FakeServer server([&](tcp::socket& s, const std::string& req) {
    seen = req;
    Send(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n");
    // One event split over two chunks, with the chunk boundary inside a CRLF.
    Send(s, Chunk("id: 1\r\nevent: stdout\r\ndata: {\"data_b64\":\"aGk=\",\"offset\":0}\r"));
    Send(s, Chunk("\n\r\n: keepalive\r\n\r\n"));
    // The client must hand this event over now, not when the response ends.
    delivered_early =
        first_seen_future.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    Send(s, Chunk("id: 2\nevent: process_exited\ndata: {\"exit_code\":3}\n\n"));
    Send(s, "0\r\n\r\n");
  });
  Client c(*ParseUrl(server.url()), "mgmt");
  std::vector<AttachEvent> events;
  StreamOptions opts;
  opts.target = "/v1/sessions/ses_1/attach";
  opts.token = "attach-token";
  opts.last_event_id = "41";
  absl::Status s = c.Stream(opts, [&](const AttachEvent& ev) -> absl::StatusOr<bool> {
    events.push_back(ev);
    if (events.size() == 1) first_seen.set_value();
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(delivered_early);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, "stdout");
  EXPECT_EQ(events[1].id, "2");
  EXPECT_THAT(seen, HasSubstr("Authorization: Bearer attach-token\r\n"));
  EXPECT_THAT(seen, HasSubstr("Last-Event-ID: 41\r\n"));
}

TEST(Client, StreamAsksForAndReadsTheBinaryForm) {
  std::string seen;
  FakeServer server([&](tcp::socket& s, const std::string& req) {
    seen = req;
    Send(s, "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.sbx.attach+binary\r\n"
            "Transfer-Encoding: chunked\r\n\r\n");
    // stdout "hi" (id 1, offset 0), then process_exited (id 2), cut inside the first header.
    const std::string out = std::string("\x01\0\0\0\0\0\0\x02", 8) +
                            std::string("\0\0\0\0\0\0\0\x01", 8) + std::string(8, '\0') + "hi";
    const std::string exit_json = R"({"exit_code":3})";
    const std::string exited = std::string("\x05\0\0\0\0\0\0", 7) +
                               static_cast<char>(exit_json.size()) +
                               std::string("\0\0\0\0\0\0\0\x02", 8) + std::string(8, '\0') +
                               exit_json;
    Send(s, Chunk(out.substr(0, 5)));
    Send(s, Chunk(out.substr(5) + exited));
    Send(s, "0\r\n\r\n");
  });
  Client c(*ParseUrl(server.url()), "t");
  std::vector<AttachEvent> events;
  absl::Status s = c.Stream({.target = "/x"}, [&](const AttachEvent& ev) -> absl::StatusOr<bool> {
    events.push_back(ev);
    return true;
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].raw);
  EXPECT_EQ(events[0].data, "hi");
  EXPECT_EQ(events[0].id, "1");
  EXPECT_EQ(events[1].type, "process_exited");
  EXPECT_EQ(events[1].data, R"({"exit_code":3})");
  EXPECT_THAT(seen, HasSubstr("application/vnd.sbx.attach+binary"));
}

TEST(Client, StreamCanBeACreateThatNamesItsSession) {
  std::string seen;
  FakeServer server([&](tcp::socket& s, const std::string& req) {
    seen = req;
    Send(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Sbx-Session-Id: ses_abc\r\nTransfer-Encoding: chunked\r\n\r\n");
    Send(s, Chunk("id: 1\nevent: process_exited\ndata: {\"exit_code\":0}\n\n"));
    Send(s, "0\r\n\r\n");
  });
  Client c(*ParseUrl(server.url()), "mgmt");
  StreamOptions opts;
  opts.target = "/v1/sandboxes/sbx_1/sessions?attach=true";
  opts.create_body = R"({"argv":["true"]})";
  opts.idempotency_key = "key-1";
  Client::StreamInfo info;
  int events = 0;
  absl::Status s = c.Stream(
      opts, [&](const AttachEvent&) -> absl::StatusOr<bool> { return ++events < 10; }, &info);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(events, 1);
  EXPECT_EQ(info.session_id, "ses_abc");
  EXPECT_THAT(seen, HasSubstr("POST /v1/sandboxes/sbx_1/sessions?attach=true HTTP/1.1\r\n"));
  EXPECT_THAT(seen, HasSubstr("Idempotency-Key: key-1\r\n"));
  EXPECT_THAT(seen, HasSubstr("Content-Type: application/json\r\n"));
  EXPECT_THAT(seen, HasSubstr("Content-Length: 17\r\n"));
}

TEST(Client, StreamBrokenMidway) {
  FakeServer server([&](tcp::socket& s, const std::string&) {
    Send(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n");
    Send(s, Chunk("id: 1\nevent: stdout\ndata: {}\n\nid: 2\nevent: std"));
  });
  Client c(*ParseUrl(server.url()), "t");
  int n = 0;
  absl::Status s = c.Stream({.target = "/x"}, [&](const AttachEvent&) -> absl::StatusOr<bool> {
    ++n;
    return true;
  });
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST(Client, StreamHttpError) {
  FakeServer server([&](tcp::socket& s, const std::string&) {
    std::string body =
        R"({"error":{"code":"unauthenticated","message":"bad token","request_id":"req_z"}})";
    Send(s, "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  Client c(*ParseUrl(server.url()), "t");
  absl::Status s = c.Stream({.target = "/x"}, [&](const AttachEvent&) -> absl::StatusOr<bool> {
    return true;
  });
  EXPECT_TRUE(absl::IsUnauthenticated(s));
  EXPECT_EQ(s.message(), "401 unauthenticated: bad token (request req_z)");
}

// --allow CIDR[:PORT]: the port follows the prefix length, so IPv6 prefixes keep their colons.
TEST(AllowFlag, ParsesCidrAndPort) {
  EXPECT_EQ(*ParseAllowFlag("203.0.113.0/24:443"),
            (nlohmann::json{{"cidr", "203.0.113.0/24"}, {"ports", "443"}}));
  EXPECT_EQ(*ParseAllowFlag("2001:db8::/32:8000-8100"),
            (nlohmann::json{{"cidr", "2001:db8::/32"}, {"ports", "8000-8100"}}));
  EXPECT_EQ(*ParseAllowFlag("203.0.113.7:80"),
            (nlohmann::json{{"cidr", "203.0.113.7"}, {"ports", "80"}}));
  EXPECT_EQ(*ParseAllowFlag("2001:db8::1"), (nlohmann::json{{"cidr", "2001:db8::1"}}));
  EXPECT_EQ(*ParseAllowFlag("10.0.0.0/8"), (nlohmann::json{{"cidr", "10.0.0.0/8"}}));
  EXPECT_EQ(*ParseAllowFlag("[2001:db8::1]:443"),
            (nlohmann::json{{"cidr", "2001:db8::1"}, {"ports", "443"}}));
  EXPECT_EQ(*ParseAllowFlag("[2001:db8::1]"), (nlohmann::json{{"cidr", "2001:db8::1"}}));
  EXPECT_FALSE(ParseAllowFlag("10.0.0.0/8:").ok());
  EXPECT_FALSE(ParseAllowFlag(":80").ok());
  EXPECT_FALSE(ParseAllowFlag("[2001:db8::1]443").ok());
  EXPECT_FALSE(ParseAllowFlag("[]:443").ok());
}

// --allow HOST[:PORT]: a name or "*." pattern becomes a domain rule, as the API takes it.
TEST(AllowFlag, ParsesDomainAndPort) {
  // spec -> {key, value, ports}; digits and dots alone are an address, whatever sbxd says of it.
  const std::vector<std::array<std::string, 4>> good = {
      {"pypi.org", "domain", "pypi.org", ""},
      {"*.pythonhosted.org:443", "domain", "*.pythonhosted.org", "443"},
      {"files.lab.test:8000-8100", "domain", "files.lab.test", "8000-8100"},
      {"localhost", "domain", "localhost", ""},
      {"203.0.113", "cidr", "203.0.113", ""},
  };
  for (const auto& [spec, key, value, ports] : good) {
    nlohmann::json want = {{key, value}};
    if (!ports.empty()) want["ports"] = ports;
    auto got = ParseAllowFlag(spec);
    ASSERT_TRUE(got.ok()) << spec << ": " << got.status();
    EXPECT_EQ(*got, want) << spec;
  }
  for (const char* bad : {"pypi.org:", "*.", "*pypi.org", "a.*.org", "pypi..org", ".pypi.org",
                          "pypi.org.", "py pi.org", "pypi_org.io", "*.*.org", "http://pypi.org",
                          "pypi.org:https", "pypi.org:1-2-3", "10.0.0.0/8:44x"}) {
    auto r = ParseAllowFlag(bad);
    ASSERT_FALSE(r.ok()) << bad << " -> " << r->dump();
    EXPECT_NE(r.status().message().find("pypi.org or *.pythonhosted.org"), std::string::npos)
        << r.status();
  }
}

}  // namespace
}  // namespace sbx::cli
