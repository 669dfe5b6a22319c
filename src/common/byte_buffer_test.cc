#include "common/byte_buffer.h"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace sbx {
namespace {

// Appends, pushes and Extend/Truncate of random sizes against a std::string doing the same:
// growth keeps every byte written before it.
TEST(ByteBuffer, MatchesAStringThroughGrowth) {
  std::mt19937 rng(3);
  ByteBuffer b;
  std::string want;
  for (int step = 0; step < 3000; ++step) {
    switch (rng() % 4) {
      case 0: {
        std::string s(rng() % 700, static_cast<char>('a' + step % 26));
        b.append(s);
        want += s;
        break;
      }
      case 1:
        b.push_back(static_cast<char>(step));
        want.push_back(static_cast<char>(step));
        break;
      case 2: {
        const size_t n = rng() % 5000;
        char* at = b.Extend(n);
        for (size_t i = 0; i < n; ++i) at[i] = static_cast<char>(rng());
        want.append(at, n);
        const size_t keep = want.size() - rng() % (n + 1);  // an Extend not wholly used
        b.Truncate(keep);
        want.resize(keep);
        break;
      }
      case 3:
        if (rng() % 50 == 0) {
          const size_t cap = b.capacity();
          b.clear();
          want.clear();
          EXPECT_EQ(b.capacity(), cap);  // reused, not freed
        }
        break;
    }
    ASSERT_EQ(b.view(), want) << step;
  }
}

TEST(ByteBuffer, EmptyAndMoved) {
  ByteBuffer a;
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.view(), "");
  a.append("");
  EXPECT_TRUE(a.empty());
  a.append("xyz");
  ByteBuffer b = std::move(a);
  EXPECT_EQ(b.view(), "xyz");
  b.Truncate(10);  // past the end: nothing changes
  EXPECT_EQ(b.view(), "xyz");
}

}  // namespace
}  // namespace sbx
