#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

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

// Ids come from a per-thread reserve of random bytes (ids.cc): across many refills and several
// threads none repeats.
TEST(Ids, NoneRepeatsAcrossRefillsAndThreads) {
  std::vector<std::vector<std::string>> made(4);
  std::vector<std::thread> threads;
  for (auto& out : made) {
    threads.emplace_back([&out] {
      for (int i = 0; i < 5000; ++i) out.push_back(NewId("op"));
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> seen;
  for (const auto& out : made) {
    for (const auto& id : out) {
      EXPECT_TRUE(IsValidId(id, "op")) << id;
      EXPECT_TRUE(seen.insert(id).second) << "repeated: " << id;
    }
  }
}

// A forked child must not hand out the ids its parent is about to: the reserve's page is
// wiped in the child (MADV_WIPEONFORK).
TEST(Ids, AForkedChildDoesNotRepeatItsParentsNextIds) {
  (void)NewId("sbx");  // the reserve is filled, with ids left in it
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string id = NewId("sbx");
    const ssize_t w = write(p[1], id.data(), id.size());
    _exit(w == static_cast<ssize_t>(id.size()) ? 0 : 1);
  }
  close(p[1]);
  char buf[64];
  const ssize_t n = read(p[0], buf, sizeof(buf));
  close(p[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(n, 0);
  const std::string child(buf, static_cast<size_t>(n));
  for (int i = 0; i < 20; ++i) EXPECT_NE(NewId("sbx"), child) << "after " << i;
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
