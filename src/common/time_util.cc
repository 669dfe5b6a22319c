#include "common/time_util.h"

#include <cstdio>

#include <ctime>

#include "absl/strings/str_format.h"

namespace sbx {

std::string FormatRfc3339(std::chrono::system_clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                         static_cast<int>(ms % 1000));
}

std::optional<std::chrono::system_clock::time_point> ParseRfc3339(const std::string& s) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, ms = 0, used = 0;
  if (s.size() != 24 ||
      std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &y, &mo, &d, &h, &mi, &sec, &ms,
                  &used) != 7 ||
      used != 24) {
    return std::nullopt;
  }
  struct tm tm {};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  const time_t secs = timegm(&tm);
  if (secs == static_cast<time_t>(-1) || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 ||
      mi > 59 || sec > 60) {
    return std::nullopt;
  }
  return std::chrono::system_clock::time_point(std::chrono::seconds(secs) +
                                               std::chrono::milliseconds(ms));
}

}  // namespace sbx
