#include "runtime/ns/fsutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("read file: open({})", path));
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("read file: read({})", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status WriteStringToFile(const std::string& path, const std::string& value, bool create) {
  int flags = O_WRONLY | O_TRUNC | O_CLOEXEC | (create ? O_CREAT : 0);
  UniqueFd fd(::open(path.c_str(), flags, 0644));
  if (!fd) return ErrnoStatus(errno, fmt::format("write file: open({})", path));
  ssize_t n;
  do {
    n = ::write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, fmt::format("write file: write({}, \"{}\")", path, value));
  if (static_cast<size_t>(n) != value.size()) {
    return absl::InternalError(fmt::format("write file: short write to {}", path));
  }
  return absl::OkStatus();
}

absl::Status MkdirAll(const std::string& path, mode_t mode) {
  if (path.empty()) return absl::InvalidArgumentError("mkdir: empty path");
  size_t pos = path[0] == '/' ? 1 : 0;
  for (;;) {
    size_t slash = path.find('/', pos);
    std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, fmt::format("mkdir: mkdir({})", prefix));
    }
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, fmt::format("mkdir: stat({})", path));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format("mkdir: {} exists and is not a directory", path));
  }
  return absl::OkStatus();
}

namespace {

// One directory being emptied. `dir` is null when it was closed to bound the number of open
// descriptors; it is then reopened through ".." of its child.
struct Frame {
  DIR* dir = nullptr;
  std::string name;  // name inside the parent frame
};

constexpr size_t kMaxOpenFrames = 32;

int OpenDirAt(int parent, const char* name) {
  int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) {
    // A directory we may not read (mode 000, e.g. overlayfs' work/work for a non-root owner).
    if (::fchmodat(parent, name, 0700, 0) == 0) {
      fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    } else {
      errno = EACCES;
    }
  }
  return fd;
}

}  // namespace

absl::Status RemoveTree(const std::string& path) {
  if (path.empty() || path == "/") return absl::InvalidArgumentError("remove tree: refusing to remove '/'");
  std::string parent_path = path;
  while (parent_path.size() > 1 && parent_path.back() == '/') parent_path.pop_back();
  size_t slash = parent_path.rfind('/');
  std::string base = slash == std::string::npos ? parent_path : parent_path.substr(slash + 1);
  parent_path = slash == std::string::npos ? "." : (slash == 0 ? "/" : parent_path.substr(0, slash));

  UniqueFd top(::open(parent_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!top) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, fmt::format("remove tree: open({})", parent_path));
  }
  // Not a directory (or a symlink): a plain unlink does it.
  if (::unlinkat(top.get(), base.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
  if (errno != EISDIR && errno != EPERM) {
    return ErrnoStatus(errno, fmt::format("remove tree: unlink({})", path));
  }

  int fd = OpenDirAt(top.get(), base.c_str());
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, fmt::format("remove tree: open({})", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, fmt::format("remove tree: fstat({})", path));
  }
  const dev_t dev = st.st_dev;

  std::vector<Frame> stack;
  size_t open_frames = 0;
  auto push = [&](int dfd, std::string name) -> absl::Status {
    DIR* d = ::fdopendir(dfd);
    if (d == nullptr) {
      int err = errno;
      ::close(dfd);
      return ErrnoStatus(err, fmt::format("remove tree: fdopendir(under {})", path));
    }
    stack.push_back(Frame{d, std::move(name)});
    ++open_frames;
    if (open_frames > kMaxOpenFrames) {
      for (Frame& f : stack) {
        if (f.dir != nullptr) {
          ::closedir(f.dir);
          f.dir = nullptr;
          --open_frames;
          break;
        }
      }
    }
    return absl::OkStatus();
  };
  auto cleanup = [&]() {
    for (Frame& f : stack) {
      if (f.dir != nullptr) ::closedir(f.dir);
    }
    stack.clear();
  };

  if (absl::Status s = push(fd, base); !s.ok()) return s;
  absl::Status result = absl::OkStatus();
  while (!stack.empty() && result.ok()) {
    Frame& cur = stack.back();
    int cfd = ::dirfd(cur.dir);
    errno = 0;
    struct dirent* e = ::readdir(cur.dir);
    if (e != nullptr) {
      const char* n = e->d_name;
      if (std::strcmp(n, ".") == 0 || std::strcmp(n, "..") == 0) continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat es;
        if (::fstatat(cfd, n, &es, AT_SYMLINK_NOFOLLOW) != 0) {
          if (errno == ENOENT) continue;
          result = ErrnoStatus(errno, fmt::format("remove tree: stat({} under {})", n, path));
          break;
        }
        is_dir = S_ISDIR(es.st_mode);
      }
      if (!is_dir) {
        if (::unlinkat(cfd, n, 0) != 0 && errno != ENOENT) {
          result = ErrnoStatus(errno, fmt::format("remove tree: unlink({} under {})", n, path));
        }
        continue;
      }
      int child = OpenDirAt(cfd, n);
      if (child < 0) {
        if (errno == ENOENT) continue;
        result = ErrnoStatus(errno, fmt::format("remove tree: open({} under {})", n, path));
        break;
      }
      if (::fstat(child, &st) != 0 || st.st_dev != dev) {
        ::close(child);
        result = absl::FailedPreconditionError(fmt::format(
            "remove tree: {} under {} is on another file system (a mount?); not crossing it", n,
            path));
        break;
      }
      result = push(child, std::string(n));
      continue;
    }
    if (errno != 0) {
      result = ErrnoStatus(errno, fmt::format("remove tree: readdir(under {})", path));
      break;
    }
    // `cur` is empty now: remove it from its parent, reopening the parent when it was closed.
    Frame done = std::move(cur);
    stack.pop_back();
    --open_frames;
    if (stack.empty()) {
      ::closedir(done.dir);
      if (::unlinkat(top.get(), done.name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        result = ErrnoStatus(errno, fmt::format("remove tree: rmdir({})", path));
      }
      break;
    }
    Frame& parent = stack.back();
    if (parent.dir == nullptr) {
      int pfd = ::openat(::dirfd(done.dir), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (pfd < 0) {
        result = ErrnoStatus(errno, fmt::format("remove tree: open(.. under {})", path));
        ::closedir(done.dir);
        break;
      }
      parent.dir = ::fdopendir(pfd);
      if (parent.dir == nullptr) {
        result = ErrnoStatus(errno, fmt::format("remove tree: fdopendir(under {})", path));
        ::close(pfd);
        ::closedir(done.dir);
        break;
      }
      ++open_frames;
    }
    ::closedir(done.dir);
    if (::unlinkat(::dirfd(parent.dir), done.name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      result = ErrnoStatus(errno, fmt::format("remove tree: rmdir({} under {})", done.name, path));
    }
  }
  cleanup();
  return result;
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoStatus(errno, fmt::format("list dir: opendir({})", path));
  std::vector<std::string> out;
  for (;;) {
    errno = 0;
    struct dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    out.emplace_back(e->d_name);
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoStatus(err, fmt::format("list dir: readdir({})", path));
  return out;
}

absl::StatusOr<uint64_t> ProcessStartTime(pid_t pid, const std::string& proc_root) {
  SBX_ASSIGN_OR_RETURN(std::string stat,
                       ReadFileToString(fmt::format("{}/{}/stat", proc_root, pid)));
  // comm (field 2) may contain spaces and parentheses: fields are counted after the last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError(fmt::format("start time: malformed {}/{}/stat", proc_root, pid));
  }
  // After ") " comes field 3 (state); field 22 is the 20th from there.
  size_t pos = close + 2;
  for (int field = 3; field < 22; ++field) {
    pos = stat.find(' ', pos);
    if (pos == std::string::npos) {
      return absl::InternalError(fmt::format("start time: short {}/{}/stat", proc_root, pid));
    }
    ++pos;
  }
  char* end = nullptr;
  unsigned long long v = std::strtoull(stat.c_str() + pos, &end, 10);
  if (end == stat.c_str() + pos) {
    return absl::InternalError(fmt::format("start time: bad field 22 in {}/{}/stat", proc_root, pid));
  }
  return static_cast<uint64_t>(v);
}

std::vector<pid_t> ParsePidList(const std::string& text) {
  std::vector<pid_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) {
      long v = std::strtol(text.c_str() + pos, nullptr, 10);
      if (v > 0) out.push_back(static_cast<pid_t>(v));
    }
    pos = nl + 1;
  }
  return out;
}

}  // namespace sbx::runtime::ns
