#include "net/dns_message.h"

#include <netinet/in.h>

#include <gtest/gtest.h>

namespace sbx::net::dns {
namespace {

void Put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v >> 8));
  s.push_back(static_cast<char>(v & 0xff));
}
void Put32(std::string& s, uint32_t v) {
  Put16(s, static_cast<uint16_t>(v >> 16));
  Put16(s, static_cast<uint16_t>(v));
}
std::string Name(const std::string& dotted) {
  std::string out;
  size_t start = 0;
  while (start < dotted.size()) {
    size_t dot = dotted.find('.', start);
    if (dot == std::string::npos) dot = dotted.size();
    out.push_back(static_cast<char>(dot - start));
    out += dotted.substr(start, dot - start);
    start = dot + 1;
  }
  out.push_back('\0');
  return out;
}
std::string Header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns, uint16_t ar) {
  std::string s;
  for (uint16_t v : {id, flags, qd, an, ns, ar}) Put16(s, v);
  return s;
}
std::string QueryBytes(const std::string& name, uint16_t type, uint16_t id = 0x1234) {
  std::string s = Header(id, 0x0100, 1, 0, 0, 0) + Name(name);
  Put16(s, type);
  Put16(s, kClassIn);
  return s;
}
IpPrefix Addr(const char* text) { return *IpPrefix::Parse(text); }

TEST(DnsMessage, ParsesAQueryLowercased) {
  auto q = ParseQuery(QueryBytes("PyPI.org", kTypeA));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->id, 0x1234);
  EXPECT_TRUE(q->rd);
  EXPECT_EQ(q->name, "pypi.org");
  EXPECT_EQ(q->qtype, kTypeA);
  EXPECT_EQ(q->udp_size, 512);
  EXPECT_FALSE(q->edns);
}

TEST(DnsMessage, ReadsEdnsPayloadSizeClamped) {
  std::string s = Header(7, 0x0100, 1, 0, 0, 1) + Name("a.b") + std::string("\0\x1c\0\x01", 4);
  s += std::string("\0\0\x29", 3);
  Put16(s, 4096);
  Put32(s, 0);
  Put16(s, 0);
  auto q = ParseQuery(s);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->edns);
  EXPECT_EQ(q->udp_size, kEdnsPayload);
  EXPECT_EQ(q->qtype, kTypeAaaa);
}

TEST(DnsMessage, RefusesMalformedQueries) {
  EXPECT_FALSE(ParseQuery("").ok());
  EXPECT_FALSE(ParseQuery(std::string(11, '\0')).ok());
  std::string two = Header(1, 0x0100, 2, 0, 0, 0) + Name("a") + std::string(4, '\1') + Name("b") +
                    std::string(4, '\1');
  EXPECT_FALSE(ParseQuery(two).ok());
  // A label with a dot inside would read as another name.
  std::string dotted = Header(1, 0x0100, 1, 0, 0, 0) + std::string("\x05""a.b.c\0", 7) + std::string(4, '\1');
  EXPECT_FALSE(ParseQuery(dotted).ok());
  // Compression in a query, a response, a trailing byte, a truncated question.
  EXPECT_FALSE(ParseQuery(Header(1, 0x0100, 1, 0, 0, 0) + std::string("\xc0\x0c\0\1\0\1", 6)).ok());
  EXPECT_FALSE(ParseQuery(Header(1, 0x8100, 1, 0, 0, 0) + Name("a") + std::string(4, '\1')).ok());
  EXPECT_FALSE(ParseQuery(QueryBytes("a", 1) + "x").ok());
  EXPECT_FALSE(ParseQuery(QueryBytes("a", 1).substr(0, 15)).ok());
  EXPECT_FALSE(ParseQuery(QueryBytes(std::string(64, 'a') + ".org", 1)).ok());
  std::string long_name;
  for (int i = 0; i < 5; ++i) long_name += std::string(60, 'a') + ".";
  long_name += "org";
  EXPECT_FALSE(ParseQuery(QueryBytes(long_name, 1)).ok());
  EXPECT_TRUE(absl::IsUnimplemented(ParseQuery(Header(1, 0x2800, 1, 0, 0, 0) + Name("a") + std::string(4, '\1')).status()));
}

TEST(DnsMessage, ErrorReplyKeepsIdNeverAnswersResponses) {
  auto r = ErrorReplyToBytes(Header(0xbeef, 0x0100, 9, 9, 9, 9));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 12u);
  EXPECT_EQ(static_cast<uint8_t>((*r)[0]), 0xbe);
  EXPECT_EQ(static_cast<uint8_t>((*r)[1]), 0xef);
  EXPECT_EQ(static_cast<uint8_t>((*r)[3]) & 0xf, kFormErr);
  EXPECT_TRUE(static_cast<uint8_t>((*r)[2]) & 0x80);
  EXPECT_FALSE(ErrorReplyToBytes(Header(1, 0x8000, 0, 0, 0, 0)).has_value());
  EXPECT_FALSE(ErrorReplyToBytes("abc").has_value());
  auto notimp = ErrorReplyToBytes(Header(1, 0x2800, 0, 0, 0, 0));
  ASSERT_TRUE(notimp.has_value());
  EXPECT_EQ(static_cast<uint8_t>((*notimp)[3]) & 0xf, kNotImp);
}

// An upstream answer with compression: www.example.org CNAME cdn.example.net, cdn A x2, plus
// an off-chain record about another name.
std::string Answer(uint16_t id, uint16_t flags = 0x8180) {
  std::string s = Header(id, flags, 1, 4, 0, 0) + Name("www.example.org");
  Put16(s, kTypeA);
  Put16(s, kClassIn);
  auto rr = [&](const std::string& owner, uint16_t type, uint32_t ttl, const std::string& rdata) {
    s += owner;
    Put16(s, type);
    Put16(s, kClassIn);
    Put32(s, ttl);
    Put16(s, static_cast<uint16_t>(rdata.size()));
    s += rdata;
  };
  rr(std::string("\xc0\x0c", 2), kTypeCname, 300, Name("cdn.example.net"));
  // "cdn.example.net" starts at 12 + 17 + 4 + 12 = 45.
  rr(std::string("\xc0\x2d", 2), kTypeA, 60, std::string("\xcb\0\x71\x07", 4));
  rr(std::string("\xc0\x2d", 2), kTypeA, 120, std::string("\x0a\0\0\x01", 4));
  rr(Name("other.org"), kTypeA, 60, std::string("\x01\x02\x03\x04", 4));
  return s;
}

TEST(DnsMessage, ParsesAnswerAndFollowsTheChain) {
  Query q = *ParseQuery(QueryBytes("www.example.org", kTypeA));
  auto r = ParseResponse(Answer(0x4242), q, 0x4242);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rcode, kNoError);
  ASSERT_EQ(r->answers.size(), 4u);
  EXPECT_EQ(r->answers[0].target, "cdn.example.net");
  EXPECT_EQ(r->answers[1].name, "cdn.example.net");
  EXPECT_EQ(r->answers[1].addr, Addr("203.0.113.7"));
  auto chain = Chain(r->answers, q.name, kTypeA);
  ASSERT_EQ(chain.size(), 3u);  // the CNAME and its two addresses, not other.org
  EXPECT_EQ(chain[0].type, kTypeCname);
  EXPECT_EQ(chain[2].addr, Addr("10.0.0.1"));
}

TEST(DnsMessage, RefusesAnswersToSomethingElse) {
  Query q = *ParseQuery(QueryBytes("www.example.org", kTypeA));
  EXPECT_FALSE(ParseResponse(Answer(0x4242), q, 0x4243).ok());  // another id
  EXPECT_FALSE(ParseResponse(Answer(0x4242, 0x0100), q, 0x4242).ok());  // not a response
  Query other = *ParseQuery(QueryBytes("www.example.com", kTypeA));
  EXPECT_FALSE(ParseResponse(Answer(0x4242), other, 0x4242).ok());
  Query aaaa = *ParseQuery(QueryBytes("www.example.org", kTypeAaaa));
  EXPECT_FALSE(ParseResponse(Answer(0x4242), aaaa, 0x4242).ok());
  std::string cut = Answer(0x4242);
  cut.resize(cut.size() - 3);
  EXPECT_FALSE(ParseResponse(cut, q, 0x4242).ok());
  // A pointer to itself (a loop) and forward.
  std::string loop = Header(1, 0x8180, 1, 0, 0, 0) + std::string("\xc0\x0c", 2);
  EXPECT_FALSE(ParseResponse(loop, q, 1).ok());
}

TEST(DnsMessage, ChainStopsAtLoopsAndLength) {
  std::vector<Record> loop = {{"a.x", kTypeCname, 1, {}, "b.x"}, {"b.x", kTypeCname, 1, {}, "a.x"}};
  EXPECT_EQ(Chain(loop, "a.x", kTypeA).size(), 2u);
  std::vector<Record> longchain;
  for (int i = 0; i < 40; ++i) {
    longchain.push_back({"n" + std::to_string(i), kTypeCname, 1, {}, "n" + std::to_string(i + 1)});
  }
  EXPECT_LE(Chain(longchain, "n0", kTypeA).size(), static_cast<size_t>(kMaxChain + 1));
}

TEST(DnsMessage, BuildReplyRoundTripsAndTruncates) {
  Query q = *ParseQuery(QueryBytes("www.example.org", kTypeA, 0x0102));
  std::vector<Record> recs = {{"www.example.org", kTypeCname, 300, {}, "cdn.example.net"}};
  for (int i = 0; i < 40; ++i) {
    uint8_t b[4] = {203, 0, 113, static_cast<uint8_t>(i)};
    recs.push_back({"cdn.example.net", kTypeA, 60, IpPrefix::Host(AF_INET, b), ""});
  }
  std::string wire = BuildReply(q, kNoError, recs, 65535);
  auto back = ParseResponse(wire, q, 0x0102);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->answers.size(), recs.size());
  EXPECT_FALSE(back->tc);
  std::string small = BuildReply(q, kNoError, recs, 512);
  EXPECT_LE(small.size(), 512u);
  auto cut = ParseResponse(small, q, 0x0102);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_TRUE(cut->tc);
  EXPECT_LT(cut->answers.size(), recs.size());
  std::string refused = BuildReply(q, kRefused, {}, 512);
  auto r = ParseResponse(refused, q, 0x0102);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rcode, kRefused);
}

TEST(DnsMessage, UpstreamQueryCarriesOnlyTheQuestion) {
  Query q = *ParseQuery(QueryBytes("Files.PythonHosted.org", kTypeAaaa));
  std::string up = BuildUpstreamQuery(q, 0x9999);
  auto back = ParseQuery(up);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, 0x9999);
  EXPECT_EQ(back->name, "files.pythonhosted.org");
  EXPECT_EQ(back->qtype, kTypeAaaa);
  EXPECT_TRUE(back->edns);
}

}  // namespace
}  // namespace sbx::net::dns
