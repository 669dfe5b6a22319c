#include "agent/users.h"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <optional>

#include <sys/stat.h>
#include <time.h>

#include <fmt/format.h>

#include "agent/bounded.h"
#include "common/files.h"

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

// The last text read of each file, kept while the file's stat identity is unchanged: the files
// are read for every session with a user, and a stat is one syscall where open, fstat, reads
// and close were five. An edit inside the sandbox changes mtime/ctime (or the inode, for an
// editor's rename); since those stamps have the kernel's coarse clock granularity, an edit
// within the same tick and of the same size would look unchanged, so a file changed in the last
// two seconds is read again every time (git's "racily clean" rule).
struct CachedFile {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  timespec mtime{}, ctime{};
  std::string text;
};

constexpr off_t kMaxCachedFileBytes = 1 << 20;
constexpr time_t kRacySeconds = 2;

bool SameStamp(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

std::string ReadFileCached(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, CachedFile>* cache = new std::map<std::string, CachedFile>;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ReadFileOrEmpty(path);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const bool racy = now.tv_sec - st.st_ctim.tv_sec < kRacySeconds ||
                    now.tv_sec - st.st_mtim.tv_sec < kRacySeconds;
  {
    std::lock_guard lock(mu);
    auto it = cache->find(path);
    if (it != cache->end()) {
      const CachedFile& c = it->second;
      if (!racy && c.dev == st.st_dev && c.ino == st.st_ino && c.size == st.st_size &&
          SameStamp(c.mtime, st.st_mtim) && SameStamp(c.ctime, st.st_ctim)) {
        return c.text;
      }
      cache->erase(it);
    }
  }
  std::string text = ReadFileOrEmpty(path);
  // Kept only when what was read is what was stat'ed: a write in between changes the size
  // or the stamps, and the next call reads again.
  struct stat after {};
  if (!racy && st.st_size <= kMaxCachedFileBytes && ::stat(path.c_str(), &after) == 0 &&
      after.st_dev == st.st_dev && after.st_ino == st.st_ino &&
      after.st_size == static_cast<off_t>(text.size()) && SameStamp(after.st_mtim, st.st_mtim) &&
      SameStamp(after.st_ctim, st.st_ctim)) {
    std::lock_guard lock(mu);
    if (cache->size() >= 8) cache->clear();  // a handful of paths at most: /etc and file ops
    (*cache)[path] = CachedFile{st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim, text};
  }
  return text;
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
  return ResolveUser(spec, ReadFileCached(passwd_path), ReadFileCached(group_path));
}

std::map<int64_t, std::string> PasswdNames(std::string_view passwd,
                                           const std::set<int64_t>& wanted) {
  std::map<int64_t, std::string> out;
  if (wanted.empty()) return out;
  // passwd: name:password:uid:...; the first entry of a uid names it, as for ResolveUser.
  ForEachEntry(passwd, 3, [&](const std::vector<std::string_view>& f) {
    const std::optional<uint32_t> uid = ParseId(f[2]);
    if (uid && wanted.count(*uid)) out.emplace(*uid, CutField(f[0]));
    return out.size() == wanted.size();
  });
  return out;
}

}  // namespace sbx::agent
