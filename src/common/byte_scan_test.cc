#include "common/byte_scan.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace sbx {
namespace {

size_t Reference(std::string_view s, char a, char b, size_t from) {
  for (size_t i = from; i < s.size(); ++i) {
    if (s[i] == a || s[i] == b) return i;
  }
  return s.size();
}

// Every length around the 64-byte SIMD step, every start, both bytes at every position, and
// bytes that differ from the targets by one bit (a comparison must be exact).
TEST(FindEitherByte, MatchesAByteLoopAtEveryPositionAndLength) {
  for (size_t len : {0, 1, 63, 64, 65, 127, 128, 129, 200}) {
    for (size_t at = 0; at <= len; ++at) {
      for (char target : {'\r', '\n'}) {
        std::string s(len, '\x0c');  // '\r' and '\n' with one bit changed
        for (size_t i = 0; i < len; i += 3) s[i] = '\x0b';
        if (at < len) s[at] = target;
        for (size_t from : {size_t{0}, at / 2, at, at + 1}) {
          ASSERT_EQ(FindEitherByte(s, '\r', '\n', from), Reference(s, '\r', '\n', from))
              << "len " << len << " at " << at << " from " << from;
        }
      }
    }
  }
}

TEST(FindEitherByte, RandomBytes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    std::string s(rng() % 400, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? (rng() % 2 ? '\n' : '\r') : rng() % 256);
    const size_t from = s.empty() ? 0 : rng() % (s.size() + 2);
    ASSERT_EQ(FindEitherByte(s, '\r', '\n', from), Reference(s, '\r', '\n', from)) << round;
  }
}

}  // namespace
}  // namespace sbx
