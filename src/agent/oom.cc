#include "agent/oom.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>

namespace sbx::agent {

uint64_t ParseOomKillCount(std::string_view text) {
  constexpr std::string_view kKey = "oom_kill";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    std::string_view line = text.substr(pos, eol == std::string_view::npos ? std::string_view::npos
                                                                            : eol - pos);
    pos = eol == std::string_view::npos ? text.size() : eol + 1;
    if (line.size() <= kKey.size() || line.substr(0, kKey.size()) != kKey ||
        line[kKey.size()] != ' ') {
      continue;
    }
    std::string_view value = line.substr(kKey.size() + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\r')) value.remove_suffix(1);
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size()) return 0;
    return n;
  }
  return 0;
}

std::optional<uint64_t> ReadOomKillCount(int fd) {
  if (fd < 0) return std::nullopt;
  // memory.oom_control and memory.events are a few hundred bytes at most.
  char buf[4096];
  ssize_t n;
  do {
    n = ::pread(fd, buf, sizeof(buf), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return std::nullopt;
  return ParseOomKillCount(std::string_view(buf, static_cast<size_t>(n)));
}

}  // namespace sbx::agent
