#include "http/framing.h"

#include <gtest/gtest.h>

#include <string>

namespace sbx::http {
namespace {

namespace bhttp = boost::beast::http;

TEST(HeaderBlockEnd, FindsTheEmptyLineAndResumes) {
  const std::string req = "GET / HTTP/1.1\r\nHost: a\r\n\r\nBODY";
  EXPECT_EQ(HeaderBlockEnd(req), req.size() - 4);
  EXPECT_EQ(HeaderBlockEnd("GET / HTTP/1.1\r\nHost: a\r\n\r"), std::string_view::npos);
  // Resuming after a prefix that ended inside the CRLFCRLF still finds it.
  const std::string_view prefix = "GET / HTTP/1.1\r\nHost: a\r\n\r";
  EXPECT_EQ(HeaderBlockEnd(req, prefix.size()), req.size() - 4);
}

std::optional<FramingError> Block(std::string s) { return CheckHeaderBlock(s); }

TEST(CheckHeaderBlock, AcceptsAnOrdinaryHeader) {
  EXPECT_FALSE(Block("GET / HTTP/1.1\r\nHost: a\r\nX-A: b c\t d\r\n\r\n"));
  EXPECT_FALSE(Block("GET / HTTP/1.1\r\n\r\n"));
}

TEST(CheckHeaderBlock, RefusesObsFoldAndWhitespaceLines) {
  for (const char* s : {"GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
                        "GET / HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n",
                        "GET / HTTP/1.1\r\n Host: a\r\n\r\n",
                        "GET / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"}) {
    auto e = Block(s);
    ASSERT_TRUE(e) << s;
    EXPECT_EQ(e->status, bhttp::status::bad_request);
    EXPECT_NE(e->message.find("whitespace"), std::string::npos) << e->message;
  }
}

TEST(CheckHeaderBlock, RefusesNulAndLoneCrOrLf) {
  EXPECT_TRUE(Block(std::string("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n", 29)));
  EXPECT_TRUE(Block("GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n"));
  EXPECT_TRUE(Block("GET / HTTP/1.1\r\nX-A: a\nX-B: b\r\n\r\n"));
  EXPECT_TRUE(Block("GET / HTTP/1.1\nHost: a\r\n\r\n"));
}

bhttp::request_header<> Header(unsigned version,
                               std::initializer_list<std::pair<const char*, const char*>> f) {
  bhttp::request_header<> h;
  h.version(version);
  h.method(bhttp::verb::post);
  h.target("/");
  for (const auto& [k, v] : f) h.insert(k, v);
  return h;
}

std::optional<bhttp::status> Status(const bhttp::request_header<>& h) {
  auto e = CheckFraming(h);
  if (!e) return std::nullopt;
  EXPECT_FALSE(e->message.empty());
  return e->status;
}

TEST(CheckFraming, AcceptsUnambiguousFraming) {
  EXPECT_FALSE(Status(Header(11, {{"Host", "a"}})));
  EXPECT_FALSE(Status(Header(11, {{"Host", "a"}, {"Content-Length", "5"}})));
  EXPECT_FALSE(Status(Header(11, {{"Host", "a"}, {"Transfer-Encoding", "chunked"}})));
  EXPECT_FALSE(Status(Header(11, {{"Host", "a"}, {"Transfer-Encoding", "CHUNKED"}})));
  EXPECT_FALSE(Status(Header(11, {{"Host", "a"}, {"Transfer-Encoding", " chunked\t"}})));
  EXPECT_FALSE(Status(Header(10, {{"Content-Length", "5"}})));  // 1.0 needs no Host
}

TEST(CheckFraming, RefusesWhatBeastAccepts) {
  constexpr auto k400 = bhttp::status::bad_request;
  constexpr auto k501 = bhttp::status::not_implemented;
  struct Case {
    const char* name;
    bhttp::request_header<> h;
    bhttp::status want;
  } cases[] = {
      {"xchunked + CL", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "xchunked"},
                                    {"Content-Length", "0"}}), k400},
      {"identity", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "identity"}}), k400},
      {"gzip", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "gzip"}}), k400},
      {"chunked, identity",
       Header(11, {{"Host", "a"}, {"Transfer-Encoding", "chunked, identity"}}), k400},
      {"gzip, chunked", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "gzip, chunked"}}),
       k501},
      {"gzip;q=1, chunked",
       Header(11, {{"Host", "a"}, {"Transfer-Encoding", "gzip;q=1, chunked"}}), k501},
      {"two fields gzip + chunked",
       Header(11, {{"Host", "a"}, {"Transfer-Encoding", "gzip"}, {"Transfer-Encoding", "chunked"}}),
       k501},
      {"chunked, chunked",
       Header(11, {{"Host", "a"}, {"Transfer-Encoding", "chunked, chunked"}}), k400},
      {"chunked;x=1", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "chunked;x=1"}}), k400},
      {"empty element", Header(11, {{"Host", "a"}, {"Transfer-Encoding", ", chunked"}}), k400},
      {"empty", Header(11, {{"Host", "a"}, {"Transfer-Encoding", ""}}), k400},
      {"not a token", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "chu\"nked"}}), k400},
      {"TE in 1.0", Header(10, {{"Transfer-Encoding", "chunked"}}), k400},
      {"TE + CL", Header(11, {{"Host", "a"}, {"Transfer-Encoding", "chunked"},
                              {"Content-Length", "5"}}), k400},
      {"two CL", Header(11, {{"Host", "a"}, {"Content-Length", "5"}, {"Content-Length", "5"}}),
       k400},
      {"CL list", Header(11, {{"Host", "a"}, {"Content-Length", "5, 5"}}), k400},
      {"no Host", Header(11, {}), k400},
      {"two Hosts", Header(11, {{"Host", "a"}, {"Host", "b"}}), k400},
      {"HTTP/2.0", Header(20, {{"Host", "a"}}), bhttp::status::http_version_not_supported},
      {"HTTP/0.9", Header(9, {{"Host", "a"}}), bhttp::status::http_version_not_supported},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Status(c.h), std::optional<bhttp::status>(c.want)) << c.name;
  }
}

// Beast itself must keep refusing these (the server relies on it; a Boost upgrade that
// relaxed one would reopen a hole).
TEST(BeastParser, RefusesWhatTheServerLeavesToIt) {
  for (const char* s : {
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 0\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: a\r\nX(A): 1\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: a\r\n: 1\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: a\r\nX-A: a\x01" "b\r\n\r\n",
           "POST / HTTP/1.x\r\nHost: a\r\n\r\n",
       }) {
    bhttp::request_parser<bhttp::string_body> p;
    boost::beast::error_code ec;
    std::string_view in(s);
    p.put(boost::asio::buffer(in.data(), in.size()), ec);
    EXPECT_TRUE(ec) << s;
  }
}

TEST(BeastParser, RefusesBadChunkSizes) {
  for (const char* body : {"zz\r\nhello\r\n0\r\n\r\n", "fffffffffffffffff1\r\nx\r\n0\r\n\r\n",
                           "-5\r\nhello\r\n0\r\n\r\n", "0x5\r\nhello\r\n0\r\n\r\n",
                           "5\r\nhello!\r\n0\r\n\r\n"}) {
    std::string in =
        std::string("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n") + body;
    bhttp::request_parser<bhttp::string_body> p;
    p.eager(true);
    boost::beast::error_code ec;
    size_t used = 0;
    while (!ec && !p.is_done() && used < in.size()) {
      used += p.put(boost::asio::buffer(in.data() + used, in.size() - used), ec);
    }
    EXPECT_TRUE(ec && ec != bhttp::error::need_more) << body << ": " << ec.message();
  }
}

}  // namespace
}  // namespace sbx::http
