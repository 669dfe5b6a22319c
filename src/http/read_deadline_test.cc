#include "http/read_deadline.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include <boost/asio.hpp>

namespace sbx::http {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

// A connected pair of loopback TCP sockets on one io_context.
struct Pair {
  asio::io_context io{1};
  tcp::socket server{io};
  tcp::socket client{io};
  Pair() {
    tcp::acceptor acc(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    client.connect(acc.local_endpoint());
    acc.accept(server);
  }
};

// Starts a read on p.server; the result lands in *out when it completes.
void StartRead(Pair& p, std::array<char, 16>& buf,
               std::optional<boost::system::error_code>& out) {
  p.server.async_read_some(asio::buffer(buf),
                           [&out](boost::system::error_code ec, size_t) { out = ec; });
}

TEST(ReadDeadline, AnExpiryCancelsThePendingReadAndSaysSo) {
  Pair p;
  ReadDeadline d(p.io.get_executor(), p.server);
  std::array<char, 16> buf;
  std::optional<boost::system::error_code> got;
  StartRead(p, buf, got);
  d.ExpiresAfter(30ms);
  p.io.run_for(2s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, asio::error::operation_aborted);
  EXPECT_TRUE(d.expired());
  // The socket stays open: an answer (408) can still be written.
  EXPECT_TRUE(p.server.is_open());
  d.Never();
  EXPECT_FALSE(d.expired());
}

TEST(ReadDeadline, MovingTheDeadlineLaterKeepsTheReadAlive) {
  Pair p;
  ReadDeadline d(p.io.get_executor(), p.server);
  std::array<char, 16> buf;
  std::optional<boost::system::error_code> got;
  StartRead(p, buf, got);
  d.ExpiresAfter(30ms);   // armed here
  d.ExpiresAfter(600ms);  // only stored: the wait at 30 ms re-arms
  p.io.run_for(200ms);
  EXPECT_FALSE(got.has_value()) << "the read was cut at the earlier deadline";
  asio::write(p.client, asio::buffer("x", 1));
  p.io.run_for(300ms);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(*got) << got->message();
  EXPECT_FALSE(d.expired());
}

TEST(ReadDeadline, MovingTheDeadlineEarlierTakesEffect) {
  Pair p;
  ReadDeadline d(p.io.get_executor(), p.server);
  std::array<char, 16> buf;
  std::optional<boost::system::error_code> got;
  StartRead(p, buf, got);
  d.ExpiresAfter(60s);
  d.ExpiresAfter(30ms);
  p.io.run_for(2s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, asio::error::operation_aborted);
  EXPECT_TRUE(d.expired());
}

TEST(ReadDeadline, NeverMeansNoCut) {
  Pair p;
  ReadDeadline d(p.io.get_executor(), p.server);
  std::array<char, 16> buf;
  std::optional<boost::system::error_code> got;
  StartRead(p, buf, got);
  d.ExpiresAfter(30ms);
  d.Never();  // a handler runs: the pending wait fires and does nothing
  p.io.run_for(200ms);
  EXPECT_FALSE(got.has_value());
  EXPECT_FALSE(d.expired());
  EXPECT_EQ(d.expiry(), ReadDeadline::Clock::time_point::max());
  p.server.cancel();
  p.io.run_for(100ms);
}

TEST(ReadDeadline, AWaitThatFiredBeforeTheDestructorTouchesNothing) {
  Pair p;
  auto d = std::make_unique<ReadDeadline>(p.io.get_executor(), p.server);
  d->ExpiresAfter(1ms);
  std::this_thread::sleep_for(20ms);
  // The timer is due: polling once queues its handler; the object goes before it runs.
  p.io.poll_one();
  d.reset();
  p.io.run_for(100ms);
  SUCCEED();
}

}  // namespace
}  // namespace sbx::http
