#include "http/connection_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace sbx::http {
namespace {

using Slot = ConnectionTable::Slot;
namespace ip = boost::asio::ip;

ip::address A(const char* s) { return ip::make_address(s); }

TEST(ConnectionTable, PerAddressCapThenReserveThenRefused) {
  metrics::Gauge open;
  ConnectionTable t(/*max=*/10, /*per_address=*/3, /*reserve=*/4, &open);
  std::vector<ConnectionTable::Lease> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(t.Admit(A("10.0.0.1")));
    EXPECT_EQ(held.back().slot(), Slot::kNormal);
  }
  for (size_t i = 0; i < ConnectionTable::kReservePerAddress; ++i) {
    held.push_back(t.Admit(A("10.0.0.1")));
    EXPECT_EQ(held.back().slot(), Slot::kReserve);
    EXPECT_EQ(held.back().reason(), ConnectionTable::kMaxPerAddress);
  }
  auto refused = t.Admit(A("10.0.0.1"));
  EXPECT_EQ(refused.slot(), Slot::kRefused);
  EXPECT_EQ(refused.reason(), ConnectionTable::kMaxPerAddress);
  // Another source is not affected.
  EXPECT_EQ(t.Admit(A("10.0.0.2")).slot(), Slot::kNormal);
  EXPECT_EQ(t.open(), 5u);
  EXPECT_EQ(open.Value(), 5);
  held.clear();
  EXPECT_EQ(t.open(), 0u);
  EXPECT_EQ(open.Value(), 0);
  EXPECT_EQ(t.Admit(A("10.0.0.1")).slot(), Slot::kNormal);
}

TEST(ConnectionTable, GlobalCapLeavesTheReserve) {
  ConnectionTable t(/*max=*/4, /*per_address=*/4, /*reserve=*/3);
  std::vector<ConnectionTable::Lease> held;
  for (int i = 0; i < 4; ++i) held.push_back(t.Admit(A("10.0.0.1")));
  auto r1 = t.Admit(A("10.0.0.2"));
  EXPECT_EQ(r1.slot(), Slot::kReserve);
  EXPECT_EQ(r1.reason(), ConnectionTable::kMaxConnections);
  auto r2 = t.Admit(A("10.0.0.3"));
  auto r3 = t.Admit(A("10.0.0.4"));
  EXPECT_EQ(r3.slot(), Slot::kReserve);
  EXPECT_EQ(t.reserve_in_use(), 3u);
  EXPECT_EQ(t.Admit(A("10.0.0.5")).slot(), Slot::kRefused);
  // A reserve slot coming back serves the next one.
  r2 = ConnectionTable::Lease();
  EXPECT_EQ(t.Admit(A("10.0.0.5")).slot(), Slot::kReserve);
  // Releasing a normal slot makes room for a normal connection again.
  held.pop_back();
  EXPECT_EQ(t.Admit(A("10.0.0.6")).slot(), Slot::kNormal);
}

TEST(ConnectionTable, AdmitReserveOnly) {
  ConnectionTable t(10, 10, 1);
  auto r = t.AdmitReserve(A("10.0.0.1"), ConnectionTable::kOpenFiles);
  EXPECT_EQ(r.slot(), Slot::kReserve);
  EXPECT_EQ(r.reason(), ConnectionTable::kOpenFiles);
  EXPECT_EQ(t.AdmitReserve(A("10.0.0.2"), ConnectionTable::kOpenFiles).slot(), Slot::kRefused);
}

TEST(ConnectionTable, KeysIpv6ByPrefixAndUnmapsV4) {
  EXPECT_EQ(ConnectionTable::KeyOf(A("2001:db8::1")),
            ConnectionTable::KeyOf(A("2001:db8::ffff:2")));
  EXPECT_NE(ConnectionTable::KeyOf(A("2001:db8::1")), ConnectionTable::KeyOf(A("2001:db8:0:1::1")));
  EXPECT_EQ(ConnectionTable::KeyOf(A("::ffff:10.0.0.1")), ConnectionTable::KeyOf(A("10.0.0.1")));
  EXPECT_NE(ConnectionTable::KeyOf(A("10.0.0.1")), ConnectionTable::KeyOf(A("10.0.0.2")));
  ConnectionTable t(10, 1, 0);
  auto a = t.Admit(A("2001:db8::1"));
  EXPECT_EQ(a.slot(), Slot::kNormal);
  EXPECT_EQ(t.Admit(A("2001:db8::2")).slot(), Slot::kRefused);
}

TEST(ConnectionTable, LeaseMoves) {
  ConnectionTable t(1, 1, 0);
  ConnectionTable::Lease a = t.Admit(A("10.0.0.1"));
  ConnectionTable::Lease b = std::move(a);
  EXPECT_EQ(t.open(), 1u);
  EXPECT_EQ(a.slot(), Slot::kRefused);  // NOLINT(bugprone-use-after-move): moved-from is empty
  b = ConnectionTable::Lease();
  EXPECT_EQ(t.open(), 0u);
}

}  // namespace
}  // namespace sbx::http
