#include "agent/users.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <optional>

#include <cstdlib>

#include <fmt/format.h>

#include "agent/bounded.h"

namespace sbx::agent {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::optional<uint32_t> ParseId(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v >= 0xffffffffULL) return std::nullopt;
  return static_cast<uint32_t>(v);
}

// Calls fn(fields) for every well-formed line with at least `min_fields` fields.
template <typename Fn>
void ForEachEntry(std::string_view text, size_t min_fields, Fn fn) {
  for (std::string_view line : Split(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    auto fields = Split(line, ':');
    if (fields.size() < min_fields) continue;
    if (fn(fields)) return;
  }
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<ResolvedUser> ResolveUser(std::string_view spec, std::string_view passwd,
                                         std::string_view group) {
  if (spec.empty()) return absl::InvalidArgumentError("user: empty user");
  std::string_view user_part = spec;
  std::optional<std::string_view> group_part;
  if (size_t colon = spec.find(':'); colon != std::string_view::npos) {
    user_part = spec.substr(0, colon);
    group_part = spec.substr(colon + 1);
    if (user_part.empty() || group_part->empty()) {
      return absl::InvalidArgumentError(fmt::format("user \"{}\": expected user[:group]", spec));
    }
  }

  ResolvedUser u;
  bool found = false;
  const std::optional<uint32_t> numeric = ParseId(user_part);
  // passwd: name:password:uid:gid:gecos:home:shell
  ForEachEntry(passwd, 4, [&](const std::vector<std::string_view>& f) {
    std::optional<uint32_t> uid = ParseId(f[2]);
    std::optional<uint32_t> gid = ParseId(f[3]);
    if (!uid || !gid) return false;
    if (numeric ? *uid != *numeric : f[0] != user_part) return false;
    u.uid = *uid;
    u.gid = *gid;
    u.name = std::string(f[0]);
    if (f.size() > 5) u.home = std::string(f[5]);
    found = true;
    return true;
  });
  if (!found) {
    if (!numeric) {
      return absl::NotFoundError(
          fmt::format("user \"{}\": no such user in /etc/passwd", user_part));
    }
    u.uid = *numeric;
    u.gid = *numeric;
  }

  if (group_part) {
    const std::optional<uint32_t> gnum = ParseId(*group_part);
    bool gfound = false;
    // group: name:password:gid:member,member
    ForEachEntry(group, 3, [&](const std::vector<std::string_view>& f) {
      std::optional<uint32_t> gid = ParseId(f[2]);
      if (!gid) return false;
      if (gnum ? *gid != *gnum : f[0] != *group_part) return false;
      u.gid = *gid;
      gfound = true;
      return true;
    });
    if (!gfound) {
      if (!gnum) {
        return absl::NotFoundError(
            fmt::format("user \"{}\": no such group \"{}\" in /etc/group", spec, *group_part));
      }
      u.gid = *gnum;
    }
  }

  u.groups.push_back(u.gid);
  if (!u.name.empty()) {
    ForEachEntry(group, 4, [&](const std::vector<std::string_view>& f) {
      std::optional<uint32_t> gid = ParseId(f[2]);
      if (!gid) return false;
      for (std::string_view member : Split(f[3], ',')) {
        if (member == u.name &&
            std::find(u.groups.begin(), u.groups.end(), *gid) == u.groups.end()) {
          u.groups.push_back(*gid);
        }
      }
      return false;
    });
  }
  return u;
}

absl::StatusOr<ResolvedUser> ResolveUserFromFiles(std::string_view spec,
                                                  const std::string& passwd_path,
                                                  const std::string& group_path) {
  return ResolveUser(spec, ReadFileOrEmpty(passwd_path), ReadFileOrEmpty(group_path));
}

std::map<int64_t, std::string> PasswdNames(std::string_view text,
                                           const std::set<int64_t>& wanted) {
  std::map<int64_t, std::string> out;
  size_t pos = 0;
  while (pos < text.size() && out.size() < wanted.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string uid_text(line.substr(c2 + 1, line.find(':', c2 + 1) - c2 - 1));
    char* e = nullptr;
    const unsigned long uid = std::strtoul(uid_text.c_str(), &e, 10);
    if (uid_text.empty() || *e != '\0' || !wanted.count(static_cast<int64_t>(uid))) continue;
    out.emplace(static_cast<int64_t>(uid), CutField(line.substr(0, c1)));
  }
  return out;
}

}  // namespace sbx::agent
