#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "common/time_util.h"
#include "common/ids.h"
#include "common/status_util.h"

namespace sbx {
namespace {

TEST(Ids, ShapeAndValidation) {
  std::string id = NewId("sbx");
  EXPECT_TRUE(IsValidId(id, "sbx")) << id;
  EXPECT_FALSE(IsValidId(id, "op"));
  EXPECT_FALSE(IsValidId("sbx_../../etc/passwd", "sbx"));
  EXPECT_FALSE(IsValidId("sbx_", "sbx"));
  EXPECT_NE(NewId("sbx"), NewId("sbx"));
}

TEST(Errno, MapsToCanonicalCodes) {
  auto s = ErrnoStatus(ENOENT, "open template: open(/x)");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(s.message()).find("open template: open(/x)"), std::string::npos);
  EXPECT_NE(std::string(s.message()).find("errno 2"), std::string::npos);
}

}  // namespace
}  // namespace sbx

namespace sbx {
namespace {

TEST(TimeUtilTest, ParseRfc3339InvertsFormat) {
  using std::chrono::system_clock;
  const auto t = system_clock::time_point(std::chrono::milliseconds(1796017886123));
  const std::string s = FormatRfc3339(t);
  EXPECT_EQ(s, "2026-11-30T05:51:26.123Z");
  auto back = ParseRfc3339(s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, t);
  for (const char* bad : {"", "2026-11-30T05:51:26Z", "2026-11-30T05:51:26.123+01:00",
                          "2026-13-30T05:51:26.123Z", "2026-11-30T05:51:26.123Zx",
                          "2026-11-30 05:51:26.123Z", "garbage garbage garbage!"}) {
    EXPECT_FALSE(ParseRfc3339(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace sbx
