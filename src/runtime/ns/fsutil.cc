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

absl::Status WriteStringToFile(const std::string& path, const std::string& value, bool create) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | (create ? O_CREAT : 0), 0644));
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

absl::Status MakeEmptyDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, fmt::format("empty dir: mkdir({})", path));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(errno, fmt::format("empty dir: lstat({})", path));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format("empty dir: {} exists and is not a directory", path));
  }
  SBX_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
  if (!names.empty()) {
    return absl::FailedPreconditionError(
        fmt::format("empty dir: {} is not empty (holds {}); remove what it holds", path, names[0]));
  }
  // mkdir applied the umask, and an existing directory may have another mode.
  if ((st.st_mode & 07777) != mode && ::chmod(path.c_str(), mode) != 0) {
    return ErrnoStatus(errno, fmt::format("empty dir: chmod({}, {:o})", path, mode));
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

// RemoveTree's walk below one directory: a stack of frames, at most kMaxOpenFrames of them
// open. Each error ends the walk; the destructor closes what is still open.
class TreeRemoval {
 public:
  TreeRemoval(const std::string& path, int top_fd, dev_t dev) : path_(path), top_(top_fd), dev_(dev) {}
  ~TreeRemoval() {
    for (Frame& f : stack_) {
      if (f.dir != nullptr) ::closedir(f.dir);
    }
  }
  TreeRemoval(const TreeRemoval&) = delete;
  TreeRemoval& operator=(const TreeRemoval&) = delete;

  // Takes `dfd` (a directory named `name` inside the frame below) onto the stack.
  absl::Status Push(int dfd, std::string name) {
    DIR* d = ::fdopendir(dfd);
    if (d == nullptr) {
      int err = errno;
      ::close(dfd);
      return ErrnoStatus(err, fmt::format("remove tree: fdopendir(under {})", path_));
    }
    stack_.push_back(Frame{d, std::move(name)});
    ++open_frames_;
    if (open_frames_ > kMaxOpenFrames) {
      for (Frame& f : stack_) {
        if (f.dir != nullptr) {
          ::closedir(f.dir);
          f.dir = nullptr;
          --open_frames_;
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  // Empties the deepest directory entry by entry, removes it, and goes on with its parent
  // until the first pushed directory is gone.
  absl::Status Run() {
    while (!stack_.empty()) {
      DIR* cur = stack_.back().dir;
      errno = 0;
      if (struct dirent* e = ::readdir(cur); e != nullptr) {
        SBX_RETURN_IF_ERROR(RemoveEntry(::dirfd(cur), e));
        continue;
      }
      if (errno != 0) return ErrnoStatus(errno, fmt::format("remove tree: readdir(under {})", path_));
      SBX_RETURN_IF_ERROR(RemoveEmptyDeepest());
    }
    return absl::OkStatus();
  }

 private:
  // A file is unlinked; a directory on the same file system is pushed, to be emptied first.
  absl::Status RemoveEntry(int cfd, const struct dirent* e) {
    const char* n = e->d_name;
    if (std::strcmp(n, ".") == 0 || std::strcmp(n, "..") == 0) return absl::OkStatus();
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat es;
      if (::fstatat(cfd, n, &es, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return absl::OkStatus();
        return ErrnoStatus(errno, fmt::format("remove tree: stat({} under {})", n, path_));
      }
      is_dir = S_ISDIR(es.st_mode);
    }
    if (!is_dir) {
      if (::unlinkat(cfd, n, 0) != 0 && errno != ENOENT) {
        return ErrnoStatus(errno, fmt::format("remove tree: unlink({} under {})", n, path_));
      }
      return absl::OkStatus();
    }
    int child = OpenDirAt(cfd, n);
    if (child < 0) {
      if (errno == ENOENT) return absl::OkStatus();
      return ErrnoStatus(errno, fmt::format("remove tree: open({} under {})", n, path_));
    }
    struct stat st;
    if (::fstat(child, &st) != 0 || st.st_dev != dev_) {
      ::close(child);
      return absl::FailedPreconditionError(fmt::format(
          "remove tree: {} under {} is on another file system (a mount?); not crossing it", n, path_));
    }
    return Push(child, std::string(n));
  }

  // The deepest directory is empty: remove it from its parent, reopening the parent when it
  // was closed.
  absl::Status RemoveEmptyDeepest() {
    Frame done = std::move(stack_.back());
    stack_.pop_back();
    --open_frames_;
    if (stack_.empty()) {
      ::closedir(done.dir);
      if (::unlinkat(top_, done.name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
        return ErrnoStatus(errno, fmt::format("remove tree: rmdir({})", path_));
      }
      return absl::OkStatus();
    }
    Frame& parent = stack_.back();
    if (parent.dir == nullptr) {
      int pfd = ::openat(::dirfd(done.dir), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (pfd < 0) {
        absl::Status st = ErrnoStatus(errno, fmt::format("remove tree: open(.. under {})", path_));
        ::closedir(done.dir);
        return st;
      }
      parent.dir = ::fdopendir(pfd);
      if (parent.dir == nullptr) {
        absl::Status st = ErrnoStatus(errno, fmt::format("remove tree: fdopendir(under {})", path_));
        ::close(pfd);
        ::closedir(done.dir);
        return st;
      }
      ++open_frames_;
    }
    ::closedir(done.dir);
    if (::unlinkat(::dirfd(parent.dir), done.name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, fmt::format("remove tree: rmdir({} under {})", done.name, path_));
    }
    return absl::OkStatus();
  }

  const std::string& path_;
  const int top_;
  const dev_t dev_;
  std::vector<Frame> stack_;
  size_t open_frames_ = 0;
};

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
  TreeRemoval walk(path, top.get(), st.st_dev);
  SBX_RETURN_IF_ERROR(walk.Push(fd, base));
  return walk.Run();
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
