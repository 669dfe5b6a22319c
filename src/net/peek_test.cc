#include "net/peek.h"

#include <openssl/ssl.h>

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

void Put16(std::string& s, size_t v) {
  s.push_back(static_cast<char>((v >> 8) & 0xff));
  s.push_back(static_cast<char>(v & 0xff));
}

std::string Ext(uint16_t type, const std::string& data) {
  std::string e;
  Put16(e, type);
  Put16(e, data.size());
  return e + data;
}

std::string SniExt(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& n : names) {
    list.push_back(0);  // host_name
    Put16(list, n.size());
    list += n;
  }
  std::string data;
  Put16(data, list.size());
  return Ext(0, data + list);
}

// A ClientHello handshake message (header included) with `exts` as its extensions.
std::string ClientHello(const std::string& exts, bool with_extensions = true) {
  std::string b;
  Put16(b, 0x0303);
  b += std::string(32, 'r');
  b.push_back(32);
  b += std::string(32, 's');
  Put16(b, 4);
  Put16(b, 0x1301);
  Put16(b, 0x0a0a);  // a GREASE cipher suite
  b.push_back(1);
  b.push_back(0);
  if (with_extensions) {
    Put16(b, exts.size());
    b += exts;
  }
  std::string hs;
  hs.push_back(1);
  hs.push_back(static_cast<char>((b.size() >> 16) & 0xff));
  Put16(hs, b.size() & 0xffff);
  return hs + b;
}

// `hs` in TLS records of at most `frag` bytes each.
std::string Records(const std::string& hs, size_t frag = 16384) {
  std::string out;
  for (size_t i = 0; i < hs.size(); i += frag) {
    std::string part = hs.substr(i, frag);
    out.push_back(0x16);
    Put16(out, 0x0301);
    Put16(out, part.size());
    out += part;
  }
  return out;
}

std::string Hello(const std::vector<std::string>& names) {
  return Records(ClientHello(Ext(0x1a1a, "") + SniExt(names) + Ext(0x002b, "\x02\x03\x04")));
}

TEST(PeekTlsTest, FindsTheServerName) {
  PeekResult r = PeekName(Hello({"Files.PythonHosted.org."}));
  ASSERT_EQ(r.state, PeekState::kName) << r.why;
  EXPECT_EQ(r.kind, PeekKind::kTls);
  EXPECT_EQ(r.name, "files.pythonhosted.org");
}

TEST(PeekTlsTest, EveryPrefixNeedsMoreAndTheWholeDecides) {
  std::string b = Hello({"pypi.org"});
  for (size_t n = 0; n < b.size(); ++n) {
    EXPECT_EQ(PeekName(std::string_view(b).substr(0, n)).state, PeekState::kNeedMore) << n;
  }
  EXPECT_EQ(PeekName(b).name, "pypi.org");
  // Trailing bytes (a client that does not wait) change nothing.
  EXPECT_EQ(PeekName(b + "\x14\x03\x03\x00\x01\x01").name, "pypi.org");
}

TEST(PeekTlsTest, ClientHelloFragmentedOverRecords) {
  std::string hs = ClientHello(SniExt({"a.example.com"}));
  for (size_t frag : {1, 7, 40, 100}) {
    std::string b = Records(hs, frag);
    PeekResult r = PeekName(b);
    ASSERT_EQ(r.state, PeekState::kName) << frag << " " << r.why;
    EXPECT_EQ(r.name, "a.example.com");
    EXPECT_EQ(PeekName(std::string_view(b).substr(0, b.size() - 1)).state, PeekState::kNeedMore);
  }
}

TEST(PeekTlsTest, RefusesWhatAServerCouldReadDifferently) {
  auto no = [](const std::string& b) { return PeekName(b).state == PeekState::kNoName; };
  EXPECT_TRUE((no(Records(ClientHello("", false)))));                    // no extensions
  EXPECT_TRUE((no(Records(ClientHello(Ext(0x002b, "\x02\x03\x04"))))));  // no SNI
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"a.com"}) + SniExt({"b.com"}))))));
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"a.com", "b.com"}))))));
  EXPECT_TRUE((no(Records(ClientHello(SniExt({}))))));
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"a.com"}) + Ext(0xfe0d, "xx"))))));  // ECH
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"a.com"}) + Ext(0xffce, "xx"))))));  // ESNI
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"10.0.0.1:443"}))))));
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"a..com"}))))));
  EXPECT_TRUE((no(Records(ClientHello(SniExt({std::string("a\0.com", 6)}))))));
  // Extensions length one short of what follows.
  std::string bad = ClientHello(SniExt({"a.com"}));
  bad.back() = 'x';
  bad.push_back('y');
  bad[3] = static_cast<char>(bad[3] + 1);
  EXPECT_TRUE((no(Records(bad))));
  // An alert or application data before the ClientHello ends.
  std::string hs = ClientHello(SniExt({"a.com"}));
  std::string first = Records(hs.substr(0, 10));
  EXPECT_TRUE((no(first + std::string("\x17\x03\x03\x00\x01x", 6))));
  // A handshake message that is not a ClientHello.
  std::string sh = hs;
  sh[0] = 2;
  EXPECT_TRUE((no(Records(sh))));
  EXPECT_TRUE((no(Records(sh).substr(0, 6))));
  // Larger than the peek limit.
  EXPECT_TRUE((no(Records(ClientHello(SniExt({"a.com"}) + Ext(0x0015, std::string(20000, 0)))))));
  // SSLv2-style hello, zero-length record.
  EXPECT_TRUE((no(std::string("\x80\x2e\x01\x00\x02", 5))));
  EXPECT_TRUE((no(std::string("\x16\x03\x01\x00\x00", 5))));
}

// A real ClientHello, as OpenSSL writes it (TLS 1.3 with its usual extensions).
TEST(PeekTlsTest, OpenSslClientHello) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  SSL* ssl = SSL_new(ctx);
  BIO* rbio = BIO_new(BIO_s_mem());
  BIO* wbio = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, rbio, wbio);
  SSL_set_connect_state(ssl);
  SSL_set_tlsext_host_name(ssl, "upload.PyPI.org");
  SSL_do_handshake(ssl);  // wants to read: the ClientHello is in wbio
  char* data = nullptr;
  long n = BIO_get_mem_data(wbio, &data);
  std::string b(data, static_cast<size_t>(n));
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  PeekResult r = PeekName(b);
  ASSERT_EQ(r.state, PeekState::kName) << r.why;
  EXPECT_EQ(r.name, "upload.pypi.org");
  EXPECT_EQ(PeekName(b.substr(0, b.size() / 2)).state, PeekState::kNeedMore);
}

TEST(PeekHttpTest, HostHeader) {
  PeekResult r = PeekName("GET /simple/ HTTP/1.1\r\nUser-Agent: x\r\nhOsT:  PyPI.org:8080 \r\n\r\n");
  ASSERT_EQ(r.state, PeekState::kName) << r.why;
  EXPECT_EQ(r.kind, PeekKind::kHttp);
  EXPECT_EQ(r.name, "pypi.org");
  EXPECT_EQ(PeekName("POST /x HTTP/1.0\r\nHost: a.b\r\nContent-Length: 3\r\n\r\nabc").name, "a.b");
  EXPECT_EQ(PeekName("OPTIONS * HTTP/1.1\r\nHost: a.b\r\n\r\n").name, "a.b");
}

TEST(PeekHttpTest, AbsoluteFormNamesTheHost) {
  EXPECT_EQ(PeekName("GET http://Example.com:80/x?y HTTP/1.1\r\n\r\n").name, "example.com");
  EXPECT_EQ(PeekName("GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n").name,
            "example.com");
  // A server uses the target's authority and ignores Host: they must agree.
  EXPECT_EQ(PeekName("GET http://evil.com/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n").state,
            PeekState::kNoName);
  EXPECT_EQ(PeekName("GET http://pypi.org@evil.com/ HTTP/1.1\r\n\r\n").state, PeekState::kNoName);
  EXPECT_EQ(PeekName("GET ftp://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n").state,
            PeekState::kNoName);
}

TEST(PeekHttpTest, PrefixesNeedMore) {
  std::string req = "GET / HTTP/1.1\r\nHost: a.com\r\nAccept: */*\r\n\r\n";
  for (size_t n = 0; n < req.size(); ++n) {
    EXPECT_EQ(PeekName(req.substr(0, n)).state, PeekState::kNeedMore) << n;
  }
  EXPECT_EQ(PeekName(req).name, "a.com");
}

TEST(PeekHttpTest, RefusesAmbiguityAndGarbage) {
  auto no = [](const std::string& b) { return PeekName(b).state == PeekState::kNoName; };
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nAccept: x\r\n\r\n")));           // no Host
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost : a.com\r\n\r\n")));        // space before colon
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nX: y\r\n Host: a.com\r\n\r\n")));  // obs-fold
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: a.com\nHost: b.com\r\n\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: 198.18.0.2:80\r\n\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: a.com:http\r\n\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: \r\n\r\n")));
  EXPECT_TRUE((no("CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n")));
  EXPECT_TRUE((no("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1 \r\nHost: a.com\r\n\r\n")));
  EXPECT_TRUE((no("SSH-2.0-OpenSSH_9.2\r\n")));
  EXPECT_TRUE((no(std::string("\x00\x01\x02", 3))));
  EXPECT_TRUE((no(" GET / HTTP/1.1\r\n")));
  EXPECT_TRUE((no("GET / HTTP/1.1\r\nHost: a.com\r\n" + std::string(kPeekLimit, 'x'))));
}

TEST(NormalizeHostNameTest, Names) {
  EXPECT_EQ(NormalizeHostName("A.B-c_d.COM."), "a.b-c_d.com");
  EXPECT_EQ(NormalizeHostName("."), "");
  EXPECT_EQ(NormalizeHostName("a..b"), "");
  EXPECT_EQ(NormalizeHostName("a.."), "");
  EXPECT_EQ(NormalizeHostName(".a"), "");
  EXPECT_EQ(NormalizeHostName(std::string(64, 'a') + ".com"), "");
  EXPECT_EQ(NormalizeHostName(std::string(63, 'a') + ".com"), std::string(63, 'a') + ".com");
  EXPECT_EQ(NormalizeHostName("a b"), "");
  EXPECT_EQ(NormalizeHostName("a%2eb"), "");
  EXPECT_EQ(NormalizeHostName("10.0.0.1"), "");
}

}  // namespace
}  // namespace sbx::net
