#include "runtime/ns/cgroup_favor.h"

#include <sys/mount.h>

#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/status_util.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(std::string_view s) {
  auto oct = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && oct(s[i + 1]) && oct(s[i + 2]) && oct(s[i + 3])) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

// Splits on `sep`, dropping empty pieces.
std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    size_t i = s.find(sep);
    std::string_view piece = s.substr(0, i);
    if (!piece.empty()) out.push_back(piece);
    if (i == std::string_view::npos) break;
    s.remove_prefix(i + 1);
  }
  return out;
}

}  // namespace

bool HasOption(std::string_view opts, std::string_view name) {
  for (std::string_view o : Split(opts, ',')) {
    if (o == name) return true;
  }
  return false;
}

absl::StatusOr<Cgroup2Mount> FindCgroup2Mount(std::string_view mountinfo) {
  for (std::string_view line : Split(mountinfo, '\n')) {
    std::vector<std::string_view> f = Split(line, ' ');
    // id parent maj:min root mount-point mount-opts [optional...] - fstype source super-opts
    size_t dash = 0;
    for (size_t i = 6; i < f.size(); ++i) {
      if (f[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 3 >= f.size()) continue;
    if (f[dash + 1] != "cgroup2") continue;
    Cgroup2Mount m;
    m.mount_point = Unescape(f[4]);
    m.mount_opts = std::string(f[5]);
    m.super_opts = std::string(f[dash + 3]);
    return m;
  }
  return absl::NotFoundError("no cgroup2 mount in mountinfo");
}

RemountArgs FavorDynmodsRemountArgs(const Cgroup2Mount& m) {
  RemountArgs a;
  a.flags = MS_REMOUNT;
  // A superblock remount also resets the per-mount flags to what is passed: keep them.
  struct Flag {
    const char* name;
    unsigned long bit;
  };
  static constexpr Flag kFlags[] = {{"ro", MS_RDONLY},       {"nosuid", MS_NOSUID},
                                    {"nodev", MS_NODEV},     {"noexec", MS_NOEXEC},
                                    {"noatime", MS_NOATIME}, {"nodiratime", MS_NODIRATIME},
                                    {"relatime", MS_RELATIME}, {"strictatime", MS_STRICTATIME}};
  for (const Flag& f : kFlags) {
    if (HasOption(m.mount_opts, f.name)) a.flags |= f.bit;
  }
  for (std::string_view o : Split(m.super_opts, ',')) {
    if (o == "rw" || o == "ro" || o == "favordynmods") continue;
    if (!a.data.empty()) a.data += ',';
    a.data.append(o.data(), o.size());
  }
  if (!a.data.empty()) a.data += ',';
  a.data += "favordynmods";
  return a;
}

absl::Status EnableCgroupFavorDynmods(const std::string& proc_root) {
  const std::string path = fmt::format("{}/self/mountinfo", proc_root);
  SBX_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  SBX_ASSIGN_OR_RETURN(Cgroup2Mount m, FindCgroup2Mount(text));
  if (HasOption(m.super_opts, "favordynmods")) return absl::OkStatus();
  RemountArgs a = FavorDynmodsRemountArgs(m);
  if (::mount(nullptr, m.mount_point.c_str(), nullptr, a.flags, a.data.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("cgroup favordynmods: mount({}, MS_REMOUNT, \"{}\")",
                                          m.mount_point, a.data));
  }
  SBX_ASSIGN_OR_RETURN(text, ReadFileToString(path));
  SBX_ASSIGN_OR_RETURN(m, FindCgroup2Mount(text));
  if (!HasOption(m.super_opts, "favordynmods")) {
    return absl::FailedPreconditionError(fmt::format(
        "cgroup favordynmods: the kernel accepted the remount of {} but ignored the option "
        "(Linux < 6.0, or sbxd is not in the initial cgroup namespace)",
        m.mount_point));
  }
  return absl::OkStatus();
}

}  // namespace sbx::runtime::ns
