#include "protocol/mux.h"

#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace sbx::protocol {
namespace {

TEST(MuxFrame, RoundTrip) {
  std::string wire;
  AppendMuxFrame(wire, MuxType::kHello, 0, {});
  AppendMuxFrame(wire, MuxType::kOpen, 7, {});
  AppendMuxFrame(wire, MuxType::kData, 7, "hello");
  AppendMuxFrame(wire, MuxType::kWindow, 65535, std::string("\0\0\1\0", 4));
  MuxFrame f;
  size_t off = 0;
  std::vector<MuxFrame> got;
  for (;;) {
    auto used = ParseMuxFrame(std::string_view(wire).substr(off), &f);
    ASSERT_TRUE(used.ok()) << used.status();
    if (*used == 0) break;
    off += *used;
    got.push_back(f);
  }
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].type, MuxType::kHello);
  EXPECT_EQ(got[1].stream, 7);
  EXPECT_EQ(got[2].payload, "hello");
  EXPECT_EQ(got[3].stream, 65535);
  EXPECT_EQ(off, wire.size());
}

TEST(MuxFrame, PartialFramesWait) {
  std::string wire;
  AppendMuxFrame(wire, MuxType::kData, 1, "abcdef");
  MuxFrame f;
  for (size_t n = 0; n < wire.size(); ++n) {
    auto used = ParseMuxFrame(std::string_view(wire).substr(0, n), &f);
    ASSERT_TRUE(used.ok());
    EXPECT_EQ(*used, 0u) << n;
  }
}

TEST(MuxFrame, RejectsWhatIsNoFrame) {
  auto bad = [](std::string wire) {
    MuxFrame f;
    return !ParseMuxFrame(wire, &f).ok();
  };
  std::string w;
  AppendMuxFrame(w, MuxType::kData, 1, "x");
  std::string t = w;
  t[0] = 9;  // unknown type
  EXPECT_TRUE(bad(t));
  t = w;
  t[1] = 1;  // reserved
  EXPECT_TRUE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kData, 0, "x");  // stream 0
  EXPECT_TRUE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kHello, 3, {});  // hello on a stream
  EXPECT_TRUE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kOpen, 3, "x");  // an open's payload is empty or a port target
  EXPECT_TRUE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kOpen, 3, std::string("\x1f\x40\x04", 3));
  EXPECT_FALSE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kEof, 3, "x");  // payload on an empty type
  EXPECT_TRUE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kWindow, 3, "xy");
  EXPECT_TRUE(bad(t));
  t.clear();
  AppendMuxFrame(t, MuxType::kData, 3, {});
  EXPECT_TRUE(bad(t));
  // A length over the limit is refused from the header alone, before its bytes arrive.
  t = std::string("\x03\x00\x00\x01\x00\x01\x00\x01", 8);
  EXPECT_TRUE(bad(t));
}

// Both pumps in threads over a socketpair (the "port"); the guest side connects to an echo
// server that answers each connection with what it read, then closes.
class MuxPumps : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/mux." + std::to_string(::getpid());
    ::mkdir(dir_.c_str(), 0700);
    echo_path_ = dir_ + "/echo.sock";
    host_path_ = dir_ + "/host.sock";
    echo_fd_ = Listen(echo_path_);
    host_fd_ = Listen(host_path_);
    ports_path_ = dir_ + "/ports.sock";
    ports_fd_ = Listen(ports_path_);
    echo_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(echo_fd_, nullptr, nullptr);
        if (c < 0) return;
        std::thread([c] {
          std::string all;
          char buf[65536];
          for (;;) {
            const ssize_t r = ::read(c, buf, sizeof(buf));
            if (r <= 0) break;
            all.append(buf, static_cast<size_t>(r));
          }
          size_t off = 0;
          while (off < all.size()) {
            const ssize_t w = ::send(c, all.data() + off, all.size() - off, MSG_NOSIGNAL);
            if (w <= 0) break;
            off += static_cast<size_t>(w);
          }
          ::close(c);
        }).detach();
      }
    });
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host_port_ = sv[0];
    guest_port_ = sv[1];
    host_opts_.port_fd = host_port_;
    host_opts_.listen_fd = host_fd_;
    host_opts_.port_listen_fd = ports_fd_;
    guest_opts_.port_fd = guest_port_;
    guest_opts_.connect_path = echo_path_;
    host_ = std::thread([this] { host_status_ = RunMuxPump(host_opts_); });
    guest_ = std::thread([this] { guest_status_ = RunMuxPump(guest_opts_); });
  }

  void TearDown() override {
    ::shutdown(guest_port_, SHUT_RDWR);  // the VM goes: both pumps see the port end
    host_.join();
    guest_.join();
    EXPECT_TRUE(host_status_.ok()) << host_status_;
    ::shutdown(echo_fd_, SHUT_RDWR);
    echo_.join();
    for (int fd : {host_port_, guest_port_, echo_fd_, host_fd_, ports_fd_}) ::close(fd);
    std::system(("rm -rf " + dir_).c_str());
  }

  static int Listen(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 64), 0);
    return fd;
  }

  // Connects through the host pump, sends `data`, half-closes, and reads the echo to the end.
  std::string RoundTrip(const std::string& data) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, host_path_.c_str(), sizeof(a.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return "connect failed";
    std::string got;
    std::thread writer([&] {
      size_t off = 0;
      while (off < data.size()) {
        const ssize_t w = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
        if (w <= 0) return;
        off += static_cast<size_t>(w);
      }
      ::shutdown(fd, SHUT_WR);
    });
    char buf[65536];
    for (;;) {
      const ssize_t r = ::read(fd, buf, sizeof(buf));
      if (r <= 0) break;
      got.append(buf, static_cast<size_t>(r));
    }
    writer.join();
    ::close(fd);
    return got;
  }

  // Through ports.sock to `target` (mux.h: u16 port, u8 family) in the "guest": the byte that
  // says connected (or nothing: refused), then the echo of `data`.
  std::pair<bool, std::string> PortRoundTrip(const std::string& target, const std::string& data) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, ports_path_.c_str(), sizeof(a.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return {false, "connect failed"};
    (void)!::send(fd, target.data(), target.size(), MSG_NOSIGNAL);
    char ack = 0;
    if (::read(fd, &ack, 1) != 1 || ack != 1) {
      ::close(fd);
      return {false, ""};
    }
    (void)!::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    std::string got;
    char buf[4096];
    for (ssize_t r; (r = ::read(fd, buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(r));
    ::close(fd);
    return {true, got};
  }

  std::string dir_, echo_path_, host_path_, ports_path_;
  int echo_fd_ = -1, host_fd_ = -1, host_port_ = -1, guest_port_ = -1, ports_fd_ = -1;
  MuxPumpOptions host_opts_, guest_opts_;
  absl::Status host_status_, guest_status_;
  std::thread echo_, host_, guest_;
};

TEST_F(MuxPumps, EchoesSmallAndEmpty) {
  EXPECT_EQ(RoundTrip("ping"), "ping");
  EXPECT_EQ(RoundTrip(""), "");
}

TEST_F(MuxPumps, LargeTransferPassesTheWindowManyTimes) {
  std::string big(8 * kMuxWindow + 12345, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 13));
  EXPECT_TRUE(RoundTrip(big) == big);
}

TEST_F(MuxPumps, ManyStreamsAtOnce) {
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 32; ++i) {
    ts.emplace_back([&, i] {
      std::string d(static_cast<size_t>(i) * 7919 + 1, static_cast<char>('a' + i % 26));
      if (RoundTrip(d) == d) ++ok;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 32);
}

// A stream whose client never reads holds only its own window: the others keep going.
TEST_F(MuxPumps, AStalledStreamDoesNotStallOthers) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, host_path_.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  std::string big(6 * kMuxWindow, 'z');
  std::thread writer([&] {
    size_t off = 0;
    while (off < big.size()) {
      const ssize_t w = ::send(fd, big.data() + off, big.size() - off, MSG_NOSIGNAL);
      if (w <= 0) return;
      off += static_cast<size_t>(w);
    }
    ::shutdown(fd, SHUT_WR);
  });
  // The echo of `big` comes back and nobody reads it; a second stream still works.
  EXPECT_EQ(RoundTrip("other"), "other");
  std::string got;
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r <= 0) break;
    got.append(buf, static_cast<size_t>(r));
  }
  writer.join();
  ::close(fd);
  EXPECT_EQ(got.size(), big.size());
}


// A TCP echo server on 127.0.0.1 (the "guest's" loopback here), one connection at a time.
class LoopbackEcho {
 public:
  LoopbackEcho() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    t_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        std::string all;
        for (ssize_t r; (r = ::read(c, buf, sizeof(buf))) > 0;) all.append(buf, static_cast<size_t>(r));
        (void)!::send(c, all.data(), all.size(), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~LoopbackEcho() {
    ::shutdown(fd_, SHUT_RDWR);
    t_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread t_;
};

std::string Target(uint16_t port, char family) {
  return std::string{static_cast<char>(port >> 8), static_cast<char>(port & 0xff), family};
}

TEST_F(MuxPumps, PortStreamsReachTheGuestsLoopbackAndRefusalsEndAtOnce) {
  LoopbackEcho server;
  auto [ok, got] = PortRoundTrip(Target(server.port(), 4), "GET / HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(ok);
  EXPECT_EQ(got, "GET / HTTP/1.1\r\n\r\n");
  // Nobody listens on a port just freed: refused, the client sees the end without the byte.
  uint16_t unused = 0;
  {
    LoopbackEcho gone;
    unused = gone.port();
  }
  EXPECT_FALSE(PortRoundTrip(Target(unused, 4), "x").first);
  // Targets that are no target (port 0, a family other than 4 or 6) end at the host's pump.
  EXPECT_FALSE(PortRoundTrip(Target(0, 4), "x").first);
  EXPECT_FALSE(PortRoundTrip(Target(server.port(), 5), "x").first);
  // A client that goes before naming its target costs nothing; the agent's streams go on.
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, ports_path_.c_str(), sizeof(a.sun_path) - 1);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    (void)!::send(fd, "\x1f", 1, MSG_NOSIGNAL);
    ::close(fd);
  }
  EXPECT_EQ(RoundTrip("still"), "still");
  EXPECT_TRUE(PortRoundTrip(Target(server.port(), 4), "again").first);
}

}  // namespace
}  // namespace sbx::protocol
