#include "api/upstream_pool.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include <boost/asio/io_context.hpp>
#include "common/unique_fd.h"
#include <gtest/gtest.h>

namespace sbx::api {
namespace {

using namespace std::chrono_literals;
using Clock = UpstreamPool::Clock;

// A connected loopback TCP pair: `client` is what the pool keeps, `server` the sandbox's end.
struct Pair {
  UniqueFd client, server;
};

Pair Connect() {
  UniqueFd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(l.get(), 4), 0);
  EXPECT_EQ(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  Pair p;
  p.client.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(p.client.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  p.server.Reset(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(p.server);
  return p;
}

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// The io_context the tests' sockets belong to (nothing runs it: the pool does no I/O).
asio::io_context& Ioc() {
  static asio::io_context ioc;
  return ioc;
}

UpstreamPool::Conn ConnOf(UniqueFd fd, asio::io_context& ioc = Ioc()) {
  tcp::socket s(ioc);
  s.assign(tcp::v4(), fd.Release());
  return UpstreamPool::Conn{std::move(s), false};
}

asio::any_io_executor Ex(asio::io_context& ioc = Ioc()) { return ioc.get_executor(); }

const void* ContextOf(tcp::socket& s) {
  return &asio::query(s.get_executor(), asio::execution::context);
}

TEST(UpstreamPoolTest, GivesBackAKeptConnectionOfTheSamePortOnly) {
  UpstreamPool pool;
  const auto now = Clock::now();
  Pair p = Connect();
  const int fd = p.client.get();
  bool watch = false;
  ASSERT_TRUE(pool.Put("sbx_a", 8000, ConnOf(std::move(p.client)), now, &watch));
  EXPECT_TRUE(watch) << "the first connection of a sandbox asks for a watch";
  EXPECT_FALSE(pool.Take("sbx_a", 8001, now, Ex()));
  EXPECT_FALSE(pool.Take("sbx_b", 8000, now, Ex()));
  auto c = pool.Take("sbx_a", 8000, now, Ex());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->sock.native_handle(), fd);
  EXPECT_EQ(pool.size(), 0u);
  EXPECT_FALSE(pool.Take("sbx_a", 8000, now, Ex()));
}

TEST(UpstreamPoolTest, DropsAConnectionTheServerClosedOrWroteTo) {
  UpstreamPool pool;
  const auto now = Clock::now();
  Pair closed = Connect(), chatty = Connect(), good = Connect();
  const int good_fd = good.client.get();
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(good.client)), now));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(chatty.client)), now));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(closed.client)), now));
  closed.server.Reset();
  ASSERT_EQ(::write(chatty.server.get(), "x", 1), 1);
  // The newest two are unusable; the oldest is still good.
  auto c = pool.Take("sbx_a", 80, now, Ex());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->sock.native_handle(), good_fd);
  EXPECT_EQ(pool.size(), 0u);
}

TEST(UpstreamPoolTest, AConnectionIdleTooLongIsNotGivenAndIsSwept) {
  UpstreamPool::Options o;
  o.max_idle = 100ms;
  UpstreamPool pool(o);
  const auto t0 = Clock::now();
  Pair p = Connect(), q = Connect();
  std::vector<uint64_t> unwatch;
  bool watch = false;
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(p.client)), t0, &watch));
  ASSERT_TRUE(watch);
  ASSERT_TRUE(pool.Watching("sbx_a", 7));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(q.client)), t0 + 50ms, &watch));
  EXPECT_FALSE(watch) << "one watch per sandbox";
  auto next = pool.Sweep(t0 + 60ms, &unwatch);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, t0 + 100ms);
  EXPECT_EQ(pool.size(), 2u);
  next = pool.Sweep(t0 + 100ms, &unwatch);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, t0 + 150ms);
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_TRUE(unwatch.empty());
  // The server sees its connection closed once it is swept.
  char b;
  EXPECT_EQ(::read(p.server.get(), &b, 1), 0);
  EXPECT_FALSE(pool.Take("sbx_a", 80, t0 + 150ms, Ex())) << "past max_idle";
  EXPECT_FALSE(pool.Sweep(t0 + 200ms, &unwatch));
  EXPECT_EQ(unwatch, std::vector<uint64_t>{7}) << "no connection left: the watch goes";
}

TEST(UpstreamPoolTest, ForgetClosesEveryPortOfTheSandboxOnly) {
  UpstreamPool pool;
  const auto now = Clock::now();
  Pair a1 = Connect(), a2 = Connect(), b = Connect();
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(a1.client)), now));
  ASSERT_TRUE(pool.Put("sbx_a", 81, ConnOf(std::move(a2.client)), now));
  ASSERT_TRUE(pool.Put("sbx_b", 80, ConnOf(std::move(b.client)), now));
  pool.Forget("sbx_a");
  EXPECT_EQ(pool.size(), 1u);
  char c;
  EXPECT_EQ(::read(a1.server.get(), &c, 1), 0);
  EXPECT_EQ(::read(a2.server.get(), &c, 1), 0);
  EXPECT_TRUE(pool.Take("sbx_b", 80, now, Ex()));
  // Forgotten: a watch arranged late finds nothing to watch, and the next Put asks again.
  EXPECT_FALSE(pool.Watching("sbx_a", 9));
  Pair again = Connect();
  bool watch = false;
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(again.client)), now, &watch));
  EXPECT_TRUE(watch);
}

TEST(UpstreamPoolTest, ClearClosesAllAndHandsBackTheWatches) {
  UpstreamPool pool;
  const auto now = Clock::now();
  Pair a = Connect(), b = Connect();
  bool watch = false;
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(a.client)), now, &watch));
  ASSERT_TRUE(watch && pool.Watching("sbx_a", 3));
  ASSERT_TRUE(pool.Put("sbx_b", 80, ConnOf(std::move(b.client)), now, &watch));
  ASSERT_TRUE(watch);  // its watch not arranged yet: nothing to hand back for it
  EXPECT_EQ(pool.Clear(), std::vector<uint64_t>{3});
  EXPECT_EQ(pool.size(), 0u);
  char c;
  EXPECT_EQ(::read(a.server.get(), &c, 1), 0);
  EXPECT_EQ(::read(b.server.get(), &c, 1), 0);
  EXPECT_FALSE(pool.Watching("sbx_b", 4));
}

TEST(UpstreamPoolTest, BoundsPerPortAndInTotal) {
  UpstreamPool::Options o;
  o.per_port = 2;
  o.total = 3;
  UpstreamPool pool(o);
  const auto now = Clock::now();
  std::vector<Pair> pairs;
  for (int i = 0; i < 5; ++i) pairs.push_back(Connect());
  EXPECT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(pairs[0].client)), now));
  EXPECT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(pairs[1].client)), now));
  EXPECT_FALSE(pool.Put("sbx_a", 80, ConnOf(std::move(pairs[2].client)), now));
  char c;
  EXPECT_EQ(::read(pairs[2].server.get(), &c, 1), 0) << "one not kept is closed";
  EXPECT_TRUE(pool.Put("sbx_a", 81, ConnOf(std::move(pairs[3].client)), now));
  EXPECT_FALSE(pool.Put("sbx_b", 80, ConnOf(std::move(pairs[4].client)), now));
  EXPECT_EQ(pool.size(), 3u);
}

TEST(UpstreamPoolTest, PrefersASocketOfTheAskingIoContextAndMovesOneOver) {
  asio::io_context other;
  UpstreamPool pool;
  const auto now = Clock::now();
  Pair mine = Connect(), theirs = Connect();
  const int mine_fd = mine.client.get();
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(mine.client)), now));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(theirs.client), other), now));
  // The newer one belongs to `other`: the asking io_context's own comes first, as it is.
  auto c = pool.Take("sbx_a", 80, now, Ex());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->sock.native_handle(), mine_fd);
  EXPECT_EQ(ContextOf(c->sock), &Ioc());
  // Only `other`'s is left: it comes over to the asking io_context, still connected.
  auto d = pool.Take("sbx_a", 80, now, Ex());
  ASSERT_TRUE(d);
  EXPECT_EQ(ContextOf(d->sock), &Ioc());
  ASSERT_EQ(::write(d->sock.native_handle(), "x", 1), 1);
  char b;
  EXPECT_EQ(::read(theirs.server.get(), &b, 1), 1);
  EXPECT_EQ(pool.size(), 0u);
}

TEST(UpstreamPoolTest, DeadOnesBetweenUsableOnesOfAnotherIoContextAreDroppedInPassing) {
  asio::io_context other;
  UpstreamPool pool;
  const auto now = Clock::now();
  // Oldest to newest: theirs_old, dead (the server wrote to it), theirs_new, dead2 (closed).
  Pair theirs_old = Connect(), dead = Connect(), theirs_new = Connect(), dead2 = Connect();
  const int old_fd = theirs_old.client.get(), new_fd = theirs_new.client.get();
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(theirs_old.client), other), now));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(dead.client), other), now));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(theirs_new.client), other), now));
  ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(dead2.client), other), now));
  ASSERT_EQ(::write(dead.server.get(), "x", 1), 1);
  dead2.server.Reset();
  // None is the asking io_context's: the newest usable one comes over, and both dead ones
  // (above it and below it) are dropped on the way.
  auto c = pool.Take("sbx_a", 80, now, Ex());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->sock.native_handle(), new_fd);
  EXPECT_EQ(ContextOf(c->sock), &Ioc());
  EXPECT_EQ(pool.size(), 1u);
  char b;
  // Closed with the server's byte unread: a reset, not an end of stream.
  EXPECT_EQ(::recv(dead.server.get(), &b, 1, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, ECONNRESET) << "the pool closed its end";
  auto d = pool.Take("sbx_a", 80, now, Ex());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->sock.native_handle(), old_fd);
  EXPECT_EQ(pool.size(), 0u);
  EXPECT_FALSE(pool.Take("sbx_a", 80, now, Ex()));
}

TEST(UpstreamPoolTest, AnIoContextThatGoesClosesItsKeptSocketsFirst) {
  UpstreamPool pool;
  const auto now = Clock::now();
  Pair gone = Connect(), stays = Connect();
  {
    asio::io_context other;
    ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(gone.client), other), now));
    ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(stays.client)), now));
    EXPECT_EQ(pool.size(), 2u);
  }  // a socket must not outlive its io_context: the pool lets go of it here
  EXPECT_EQ(pool.size(), 1u);
  char b;
  EXPECT_EQ(::read(gone.server.get(), &b, 1), 0);
  EXPECT_TRUE(pool.Take("sbx_a", 80, now, Ex()));
}

TEST(UpstreamPoolTest, APoolThatGoesBeforeItsIoContextsLeavesThemNothing) {
  Pair p = Connect();
  auto other = std::make_unique<asio::io_context>();
  {
    UpstreamPool pool;
    ASSERT_TRUE(pool.Put("sbx_a", 80, ConnOf(std::move(p.client), *other), Clock::now()));
  }
  char b;
  EXPECT_EQ(::read(p.server.get(), &b, 1), 0);
  other.reset();  // its shutdown finds no pool to call (ASan would see one freed)
}

}  // namespace
}  // namespace sbx::api
