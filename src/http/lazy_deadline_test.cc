#include "http/lazy_deadline.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include <boost/asio.hpp>

namespace sbx::http {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

// A connected pair of loopback TCP sockets on one io_context, a deadline on the server's end,
// and a read pending there whose result lands in `got`.
class LazyDeadlineTest : public ::testing::Test {
 protected:
  LazyDeadlineTest() {
    tcp::acceptor acc(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    client.connect(acc.local_endpoint());
    acc.accept(server);
  }
  // What a connection's deadline does when it passes: cancels the pending read.
  std::function<void()> CancelServer() {
    return [this] {
      boost::system::error_code ignored;
      server.cancel(ignored);
    };
  }
  void StartRead() {
    server.async_read_some(asio::buffer(buf),
                           [this](boost::system::error_code ec, size_t) { got = ec; });
  }
  asio::io_context io{1};
  tcp::socket server{io};
  tcp::socket client{io};
  std::array<char, 16> buf;
  std::optional<boost::system::error_code> got;
};

TEST_F(LazyDeadlineTest, AnExpiryCancelsThePendingReadAndSaysSo) {
  LazyDeadline d(io.get_executor(), CancelServer());
  StartRead();
  d.ExpiresAfter(30ms);
  io.run_for(2s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, asio::error::operation_aborted);
  EXPECT_TRUE(d.expired());
  // The socket stays open: an answer (408) can still be written.
  EXPECT_TRUE(server.is_open());
  d.Never();
  EXPECT_FALSE(d.expired());
}

TEST_F(LazyDeadlineTest, MovingTheDeadlineLaterKeepsTheReadAlive) {
  LazyDeadline d(io.get_executor(), CancelServer());
  StartRead();
  d.ExpiresAfter(30ms);   // armed here
  d.ExpiresAfter(600ms);  // only stored: the wait at 30 ms re-arms
  io.run_for(200ms);
  EXPECT_FALSE(got.has_value()) << "the read was cut at the earlier deadline";
  asio::write(client, asio::buffer("x", 1));
  io.run_for(300ms);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(*got) << got->message();
  EXPECT_FALSE(d.expired());
}

TEST_F(LazyDeadlineTest, MovingTheDeadlineEarlierTakesEffect) {
  LazyDeadline d(io.get_executor(), CancelServer());
  StartRead();
  d.ExpiresAfter(60s);
  d.ExpiresAfter(30ms);
  io.run_for(2s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, asio::error::operation_aborted);
  EXPECT_TRUE(d.expired());
}

TEST_F(LazyDeadlineTest, NeverMeansNoCut) {
  LazyDeadline d(io.get_executor(), CancelServer());
  StartRead();
  d.ExpiresAfter(30ms);
  d.Never();  // a handler runs: the pending wait fires and does nothing
  io.run_for(200ms);
  EXPECT_FALSE(got.has_value());
  EXPECT_FALSE(d.expired());
  EXPECT_EQ(d.expiry(), LazyDeadline::Clock::time_point::max());
  server.cancel();
  io.run_for(100ms);
}

TEST_F(LazyDeadlineTest, AWaitThatFiredBeforeTheDestructorTouchesNothing) {
  int fired = 0;
  auto d = std::make_unique<LazyDeadline>(io.get_executor(), [&fired] { ++fired; });
  d->ExpiresAfter(1ms);
  std::this_thread::sleep_for(20ms);
  io.poll_one();  // the timer is due: its completion is collected, perhaps run
  const int before = fired;
  d.reset();
  io.run_for(100ms);
  EXPECT_EQ(fired, before) << "on_expiry ran after the deadline was gone";
  EXPECT_LE(fired, 1);
}

}  // namespace
}  // namespace sbx::http
