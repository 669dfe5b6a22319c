#include "runtime/microvm/host_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/digest.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::runtime::microvm {
namespace fs = std::filesystem;
namespace {

absl::Status CopyFile(int src_dir, const char* name, int dst_dir, const struct stat& st) {
  UniqueFd in(::openat(src_dir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in.valid()) return ErrnoStatus(errno, fmt::format("host view: open {}", name));
  UniqueFd out(::openat(dst_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 07777));
  if (!out.valid()) return ErrnoStatus(errno, fmt::format("host view: create {}", name));
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(in.get(), buf, sizeof(buf));
    if (r < 0) return ErrnoStatus(errno, fmt::format("host view: read {}", name));
    if (r == 0) break;
    for (ssize_t off = 0; off < r;) {
      const ssize_t w = ::write(out.get(), buf + off, static_cast<size_t>(r - off));
      if (w < 0) return ErrnoStatus(errno, fmt::format("host view: write {}", name));
      off += w;
    }
  }
  (void)::fchown(out.get(), st.st_uid, st.st_gid);
  (void)::fchmod(out.get(), st.st_mode & 07777);
  return absl::OkStatus();
}

// A DIR* over a close-on-exec copy of `dir` (closedir closes the copy, `dir` stays open);
// nullptr with errno set.
DIR* OpenDirCopy(int dir) {
  const int copy = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return nullptr;
  DIR* d = ::fdopendir(copy);
  if (d == nullptr) {
    const int err = errno;
    ::close(copy);
    errno = err;
  }
  return d;
}

absl::Status CopyTree(int src, int dst, const std::string& rel,
                      const std::map<std::string, bool>& masks) {
  DIR* d = OpenDirCopy(src);
  if (d == nullptr) return ErrnoStatus(errno, fmt::format("host view: opendir {}", rel));
  absl::Status first;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = rel.empty() ? name : rel + "/" + name;
    if (auto m = masks.find(path); m != masks.end()) {
      // Hidden: what the ns runtime's mask shows instead.
      if (m->second) {
        ::mkdirat(dst, name.c_str(), 0555);
      } else {
        UniqueFd f(::openat(dst, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
      }
      continue;
    }
    struct stat st;
    if (::fstatat(src, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    absl::Status s;
    if (S_ISDIR(st.st_mode)) {
      if (::mkdirat(dst, name.c_str(), 0700) != 0) {
        s = ErrnoStatus(errno, fmt::format("host view: mkdir {}", path));
      } else {
        UniqueFd sub_src(::openat(src, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        UniqueFd sub_dst(::openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (sub_src.valid() && sub_dst.valid()) {
          s = CopyTree(sub_src.get(), sub_dst.get(), path, masks);
          (void)::fchown(sub_dst.get(), st.st_uid, st.st_gid);
          (void)::fchmod(sub_dst.get(), st.st_mode & 07777);
        }
      }
    } else if (S_ISREG(st.st_mode)) {
      s = CopyFile(src, name.c_str(), dst, st);
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(4096, '\0');
      const ssize_t n = ::readlinkat(src, name.c_str(), target.data(), target.size());
      if (n >= 0) {
        target.resize(static_cast<size_t>(n));
        if (::symlinkat(target.c_str(), dst, name.c_str()) == 0) {
          (void)::fchownat(dst, name.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
        }
      }
    }
    if (!s.ok() && first.ok()) first = s;
  }
  ::closedir(d);
  return first;
}

// What changes when anything in the tree changes (names, kinds, modes, owners, sizes, mtimes,
// link targets): a view is named by it, so a view in use is never rewritten.
void Stamp(int dir, const std::string& rel, std::string& out) {
  DIR* d = OpenDirCopy(dir);
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    struct stat st;
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    out += fmt::format("{}/{} {:o} {} {} {} {}.{}\n", rel, name, st.st_mode, st.st_uid, st.st_gid,
                       st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    if (S_ISDIR(st.st_mode)) {
      UniqueFd sub(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.valid()) Stamp(sub.get(), rel + "/" + name, out);
    }
  }
}

bool Under(const std::string& path, const std::string& dir) {
  return dir == "/" ? path != "/" : path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                                        path[dir.size()] == '/';
}

}  // namespace

absl::Status CopyMasked(const std::string& src, const std::string& dst,
                        const std::vector<std::pair<std::string, bool>>& masks) {
  UniqueFd s(::open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!s.valid()) return ErrnoStatus(errno, fmt::format("host view: open({})", src));
  if (::mkdir(dst.c_str(), 0755) != 0) return ErrnoStatus(errno, fmt::format("host view: mkdir({})", dst));
  UniqueFd d(::open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d.valid()) return ErrnoStatus(errno, fmt::format("host view: open({})", dst));
  std::map<std::string, bool> m(masks.begin(), masks.end());
  return CopyTree(s.get(), d.get(), "", m);
}

absl::StatusOr<std::vector<GuestShare>> SharesForBinds(const std::vector<BindMount>& binds,
                                                       const std::string& views_dir) {
  std::vector<GuestShare> out;
  for (size_t i = 0; i < binds.size(); ++i) {
    const BindMount& b = binds[i];
    bool nested = false;
    for (size_t j = 0; j < binds.size(); ++j) {
      if (j != i && Under(b.sandbox_path, binds[j].sandbox_path)) nested = true;
    }
    if (nested) continue;  // folded into the copy of the bind it lies in
    std::error_code ec;
    if (!fs::is_directory(b.host_path, ec)) {
      return absl::InvalidArgumentError(fmt::format(
          "microvm: the template binds the file {} at {}; a microVM's shares are directories",
          b.host_path, b.sandbox_path));
    }
    std::vector<std::pair<std::string, bool>> masks;
    for (const BindMount& inner : binds) {
      if (!Under(inner.sandbox_path, b.sandbox_path)) continue;
      const std::string rel = inner.sandbox_path.substr(b.sandbox_path == "/" ? 1 : b.sandbox_path.size() + 1);
      masks.emplace_back(rel, fs::is_directory(inner.host_path, ec));
    }
    if (masks.empty()) {
      out.push_back({b.host_path, b.sandbox_path});
      continue;
    }
    std::string key = b.host_path;
    for (const auto& [rel, dir] : masks) key += fmt::format("\n{}{}", rel, dir ? "/" : "");
    {
      UniqueFd root(::open(b.host_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!root.valid()) return ErrnoStatus(errno, fmt::format("host view: open({})", b.host_path));
      Stamp(root.get(), "", key);
    }
    const std::string view = fmt::format("{}/{}", views_dir, Sha256Hex(key).substr(0, 32));
    if (!fs::exists(view, ec)) {
      fs::create_directories(views_dir, ec);
      const std::string tmp = fmt::format("{}.tmp-{}", view, ::getpid());
      fs::remove_all(tmp, ec);
      SBX_RETURN_IF_ERROR(Annotate(CopyMasked(b.host_path, tmp, masks),
                                   fmt::format("microvm: a masked copy of {}", b.host_path)));
      if (::rename(tmp.c_str(), view.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST) {
        return ErrnoStatus(errno, fmt::format("host view: rename({}, {})", tmp, view));
      }
    }
    out.push_back({view, b.sandbox_path});
  }
  return out;
}

}  // namespace sbx::runtime::microvm
