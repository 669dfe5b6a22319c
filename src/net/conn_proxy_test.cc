// ConnProxy on loopback, without root: the hooks stand in for NetworkHost (the sandbox is
// 127.0.0.1, the "original destination" a test server on 127.0.0.1). The nftables redirect
// and SO_ORIGINAL_DST are covered end to end in tests/e2e/test_egress_proxy.py.
#include "net/conn_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace sbx::net {
namespace {

IpPrefix Loopback() {
  const uint8_t a[4] = {127, 0, 0, 1};
  return IpPrefix::Host(AF_INET, a);
}

EgressRule Rule(const nlohmann::json& j) {
  auto r = ParseRule(j, "test");
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

int Listen(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 64), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// Connects to 127.0.0.1:port; -1 when the proxy reset the connection before connect() returned
// (a refusal at accept can beat the client's return from the handshake on loopback).
int DialOrReset(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const int err = errno;
    close(fd);
    EXPECT_EQ(err, ECONNRESET) << "connect to 127.0.0.1:" << port << ": " << strerror(err);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

int Dial(uint16_t port) {
  int fd = DialOrReset(port);
  EXPECT_GE(fd, 0) << "the proxy reset a connection it should have kept";
  return fd;
}

void SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads to EOF; returns what came and whether the end was a reset (a timeout fails the test).
std::pair<std::string, bool> ReadAll(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return {out, false};
    if (n < 0) {
      // SO_RCVTIMEO expired: the proxy neither relayed nor ended the connection.
      EXPECT_NE(errno, EAGAIN) << "no EOF and no reset within 10 s";
      return {out, true};
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

// The stand-in destination: an echo server that greets first when `greet` (a protocol where
// the server speaks first) and closes after the client's FIN.
class Echo {
 public:
  explicit Echo(bool greet = false) : greet_(greet) {
    fd_ = Listen(&port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Echo() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
    for (auto& t : conns_) t.join();
  }
  uint16_t port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  void Serve() {
    while (true) {
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      ++accepted_;
      conns_.emplace_back([this, c] {
        if (greet_) SendAll(c, "SSH-2.0-test\r\n");
        char buf[65536];
        while (true) {
          ssize_t n = recv(c, buf, sizeof(buf), 0);
          if (n <= 0) break;
          SendAll(c, std::string(buf, static_cast<size_t>(n)));
        }
        close(c);
      });
    }
  }
  bool greet_;
  int fd_;
  uint16_t port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
  std::vector<std::thread> conns_;
};

struct Denied {
  std::string id, reason, name;
  uint16_t port;
};

TEST(ConnProxyJudgeTest, CidrFirstThenNameThenAddress) {
  EffectiveRules r;
  r.allow = {Rule({{"domain", "pypi.org"}, {"ports", "443"}}),
             Rule({{"cidr", "203.0.113.0/24"}, {"ports", "22"}, {"protocol", "tcp"}})};
  r.deny = {Rule({{"cidr", "203.0.113.9/32"}})};
  IpPrefix a = *IpPrefix::Parse("203.0.113.5");
  IpPrefix denied = *IpPrefix::Parse("203.0.113.9");
  EXPECT_EQ(JudgeCidr(r, a, 22), CidrVerdict::kAllowed);
  EXPECT_EQ(JudgeCidr(r, denied, 22), CidrVerdict::kDenied);
  EXPECT_EQ(JudgeCidr(r, a, 443), CidrVerdict::kNone);
  auto yes = [](const std::string&, const IpPrefix&) { return true; };
  auto no = [](const std::string&, const IpPrefix&) { return false; };
  PeekResult named;
  named.state = PeekState::kName;
  named.name = "pypi.org";
  EXPECT_EQ(JudgeName(r, named, a, 443, yes), "");
  EXPECT_EQ(JudgeName(r, named, a, 443, no), kReasonNameAddressMismatch);
  EXPECT_EQ(JudgeName(r, named, a, 80, yes), kReasonNameNotAllowed);  // the rule's port is 443
  named.name = "evil.org";
  EXPECT_EQ(JudgeName(r, named, a, 443, yes), kReasonNameNotAllowed);
  EXPECT_EQ(JudgeName(r, PeekResult{.state = PeekState::kNoName}, a, 443, yes), kReasonNoName);
  // A PATCH: what stays.
  EXPECT_TRUE(StillAllowed(r, "pypi.org", a, 443));
  EXPECT_TRUE(StillAllowed(r, "", a, 22));
  EXPECT_FALSE(StillAllowed(r, "", denied, 22));
  EffectiveRules none;
  EXPECT_FALSE(StillAllowed(none, "pypi.org", a, 443));
  // UDP-only CIDR rules never admit a TCP connection.
  EXPECT_FALSE(CidrRuleAdmits(Rule({{"cidr", "203.0.113.0/24"}, {"protocol", "udp"}}), a, 53));
}

// Sends `all` through the proxy to the echo server while reading, then half-closes (the FIN
// must reach the server, which then closes); expects every byte back, in order, no reset.
void ExpectEchoedWhole(int fd, const std::string& all) {
  std::thread writer([&] {
    SendAll(fd, all);
    shutdown(fd, SHUT_WR);
  });
  auto [got, reset] = ReadAll(fd);
  writer.join();
  close(fd);
  EXPECT_FALSE(reset);
  EXPECT_EQ(got.size(), all.size());
  EXPECT_TRUE(got == all);
}

class ConnProxyTest : public ::testing::Test {
 protected:
  void StartProxy(uint16_t dest_port) {
    rules_.allow = {Rule({{"domain", "allowed.test"}}), Rule({{"domain", "*.wild.test"}, {"ports", "1-65535"}})};
    ProxyHooks h;
    h.id_of_address = [](const IpPrefix& src) -> std::optional<std::string> {
      if (src == Loopback()) return "sb1";
      return std::nullopt;
    };
    h.rules_of = [this](const std::string& id) -> std::optional<EffectiveRules> {
      std::lock_guard<std::mutex> lock(mu_);
      if (id != "sb1") return std::nullopt;
      return rules_;
    };
    h.resolved = [this](const std::string& id, const std::string& name, const IpPrefix& a) {
      return id == "sb1" && a == Loopback() && name != unresolved_;
    };
    h.forbidden = [](const IpPrefix&) -> std::optional<std::string> { return std::nullopt; };
    h.deny = [this](const std::string& id, const std::string& reason, const IpPrefix&,
                    const std::string& name, uint16_t port) {
      std::lock_guard<std::mutex> lock(mu_);
      denied_.push_back({id, reason, name, port});
    };
    h.original_dst = [dest_port](int) -> absl::StatusOr<std::pair<IpPrefix, uint16_t>> {
      return std::make_pair(Loopback(), dest_port);
    };
    ProxyOptions o;
    o.loopback_only = true;
    auto p = ConnProxy::Start(o, std::move(h));
    ASSERT_TRUE(p.ok()) << p.status();
    proxy_ = std::move(*p);
  }

  std::vector<Denied> Denials() {
    std::lock_guard<std::mutex> lock(mu_);
    return denied_;
  }

  std::mutex mu_;
  EffectiveRules rules_;
  std::string unresolved_ = "unresolved.test";
  std::vector<Denied> denied_;
  std::unique_ptr<ConnProxy> proxy_;
};

TEST_F(ConnProxyTest, RelaysAnAllowedHostBothWaysWithHalfClose) {
  Echo echo;
  StartProxy(echo.port());
  int fd = Dial(proxy_->port());
  std::string req = "POST / HTTP/1.1\r\nHost: Allowed.Test:8080\r\nContent-Length: 3000000\r\n\r\n";
  std::string body(3000000, 'x');
  for (size_t i = 0; i < body.size(); i += 4093) body[i] = static_cast<char>('a' + i % 26);
  ExpectEchoedWhole(fd, req + body);
  EXPECT_TRUE(Denials().empty());
}

// A client with a small receive buffer: the pipe toward it can fill, and the proxy then stops
// reading the upstream until some went out; nothing is lost or reordered, in either direction.
TEST_F(ConnProxyTest, ASlowReaderFillsThePipeAndLosesNothing) {
  Echo echo;
  StartProxy(echo.port());
  int fd = Dial(proxy_->port());
  const int small = 65536;  // below the pipe (256 KiB); smaller makes TCP itself crawl
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
  std::string req = "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 2000000\r\n\r\n";
  std::string body(2000000, 'y');
  for (size_t i = 0; i < body.size(); i += 1021) body[i] = static_cast<char>('A' + i % 26);
  ExpectEchoedWhole(fd, req + body);
}

TEST_F(ConnProxyTest, RefusesANameNotAllowed) {
  Echo echo;
  StartProxy(echo.port());
  int fd = Dial(proxy_->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n");
  auto [got, reset] = ReadAll(fd);
  close(fd);
  EXPECT_TRUE(reset);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(echo.accepted(), 0);
  auto d = Denials();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].reason, kReasonNameNotAllowed);
  EXPECT_EQ(d[0].name, "evil.test");
  EXPECT_EQ(d[0].port, echo.port());
}

TEST_F(ConnProxyTest, RefusesAnAllowedNameAtAnAddressItDidNotResolveTo) {
  Echo echo;
  StartProxy(echo.port());
  unresolved_ = "a.wild.test";
  int fd = Dial(proxy_->port());
  SendAll(fd, "GET / HTTP/1.1\r\nHost: a.wild.test\r\n\r\n");
  EXPECT_TRUE(ReadAll(fd).second);
  close(fd);
  auto d = Denials();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].reason, kReasonNameAddressMismatch);
}

TEST_F(ConnProxyTest, RefusesGarbageAndAnEarlyFin) {
  Echo echo;
  StartProxy(echo.port());
  int a = Dial(proxy_->port());
  SendAll(a, std::string("\x00\x01garbage", 9));
  EXPECT_TRUE(ReadAll(a).second);
  close(a);
  int b = Dial(proxy_->port());
  SendAll(b, "GET / HTTP/1.1\r\nHost: allowed.test\r\n");  // no blank line, then FIN
  shutdown(b, SHUT_WR);
  EXPECT_TRUE(ReadAll(b).second);
  close(b);
  auto d = Denials();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].reason, kReasonNoName);
  EXPECT_EQ(d[1].reason, kReasonNoName);
  EXPECT_EQ(echo.accepted(), 0);
}

TEST_F(ConnProxyTest, WaitsForARequestSentInPieces) {
  Echo echo;
  StartProxy(echo.port());
  int fd = Dial(proxy_->port());
  std::string req = "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
  for (char ch : req) {
    SendAll(fd, std::string(1, ch));
    usleep(2000);
  }
  shutdown(fd, SHUT_WR);
  auto [got, reset] = ReadAll(fd);
  close(fd);
  EXPECT_FALSE(reset);
  EXPECT_EQ(got, req);
}

TEST_F(ConnProxyTest, ACidrRuleNeedsNoName) {
  Echo echo(/*greet=*/true);
  StartProxy(echo.port());
  {
    std::lock_guard<std::mutex> lock(mu_);
    rules_.allow.push_back(Rule({{"cidr", "127.0.0.1/32"}, {"ports", std::to_string(echo.port())}, {"protocol", "tcp"}}));
  }
  int fd = Dial(proxy_->port());
  char buf[64];
  ssize_t n = recv(fd, buf, sizeof(buf), 0);  // the server speaks first
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "SSH-2.0-test\r\n");
  close(fd);
}

TEST_F(ConnProxyTest, CutDisallowedResetsWhatTheNewRulesForbid) {
  Echo echo;
  StartProxy(echo.port());
  int keep = Dial(proxy_->port());
  int cut = Dial(proxy_->port());
  SendAll(keep, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
  SendAll(cut, "GET / HTTP/1.1\r\nHost: x.wild.test\r\n\r\n");
  char buf[256];
  ASSERT_GT(recv(keep, buf, sizeof(buf), 0), 0);  // both relayed (echoed)
  ASSERT_GT(recv(cut, buf, sizeof(buf), 0), 0);
  EXPECT_EQ(proxy_->Connections("sb1").size(), 2u);
  EffectiveRules narrower;
  narrower.allow = {Rule({{"domain", "allowed.test"}})};
  EXPECT_EQ(proxy_->CutDisallowed("sb1", narrower), 1u);
  EXPECT_EQ(proxy_->CutDisallowed("sb1", narrower), 0u);  // idempotent
  SendAll(cut, "more");
  // Reset or EOF, and nothing sent after the cut comes back.
  EXPECT_EQ(ReadAll(cut).first.find("more"), std::string::npos);
  SendAll(keep, "still");
  ssize_t n = recv(keep, buf, sizeof(buf), 0);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "still");
  auto live = proxy_->Connections("sb1");
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].name, "allowed.test");
  EXPECT_EQ(proxy_->CloseAll("sb1"), 1u);
  EXPECT_TRUE(ReadAll(keep).first.empty());
  close(keep);
  close(cut);
  for (int i = 0; i < 200 && proxy_->Count() > 0; ++i) usleep(10000);
  EXPECT_EQ(proxy_->Count(), 0u);
}

TEST_F(ConnProxyTest, UnknownSourceIsReset) {
  Echo echo;
  StartProxy(echo.port());
  ProxyHooks h;
  h.id_of_address = [](const IpPrefix&) -> std::optional<std::string> { return std::nullopt; };
  ProxyOptions o;
  o.loopback_only = true;
  auto p = ConnProxy::Start(o, std::move(h));
  ASSERT_TRUE(p.ok());
  int fd = DialOrReset((*p)->port());
  if (fd >= 0) {  // else the reset came before connect() returned: the same refusal
    EXPECT_TRUE(ReadAll(fd).second);
    close(fd);
  }
  EXPECT_EQ(echo.accepted(), 0);
}

}  // namespace
}  // namespace sbx::net
