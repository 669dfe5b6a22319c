// watch: inotify events of a directory (or a tree) as kData frames until the host leaves.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/files_internal.h"
#include "common/path_resolve.h"
#include "common/unique_fd.h"
#include "protocol/limits.h"

namespace sbx::agent::fileops {
namespace {

constexpr size_t kMaxWatches = 8192;

class Watcher {
 public:
  Watcher(Conn& c, bool recursive) : c_(c), recursive_(recursive) {}

  absl::Status Init(int dir_fd, const std::string& path) {
    ino_.Reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!ino_) return ErrnoStatus(errno, "watch: inotify_init1");
    return Add(dir_fd, path, /*top=*/true);
  }

  // Serves events until the host goes away (EOF on the connection) or the watched directory
  // itself is deleted.
  absl::Status Run() {
    std::vector<char> buf(64 * 1024);
    // A rename's IN_MOVED_FROM and IN_MOVED_TO are queued one after the other, but a read may
    // end between them (a slow guest under emulation does): an unpaired IN_MOVED_FROM waits
    // kMovePairWait for its other half in the next read before it counts as a delete.
    std::map<uint32_t, std::pair<std::string, bool>> moved_from;  // cookie -> path, is_dir
    std::chrono::steady_clock::time_point pair_until{};
    for (;;) {
      pollfd fds[2] = {{ino_.get(), POLLIN, 0}, {c_.fd(), POLLIN | POLLRDHUP, 0}};
      int timeout_ms = -1;
      if (!moved_from.empty()) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            pair_until - std::chrono::steady_clock::now());
        timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
      }
      int n = ::poll(fds, 2, timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "watch: poll");
      }
      if (n == 0) {
        SBX_RETURN_IF_ERROR(EmitMovedAway(moved_from));
        continue;
      }
      // The host sends nothing after the request: anything readable is EOF or an error.
      if (fds[1].revents) return absl::OkStatus();
      if (!(fds[0].revents & POLLIN)) continue;
      ssize_t len = ::read(ino_.get(), buf.data(), buf.size());
      if (len < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoStatus(errno, "watch: read inotify");
      }
      // Halves left from the last read pair only with the first events of this one.
      std::map<uint32_t, std::pair<std::string, bool>> carried;
      carried.swap(moved_from);
      for (ssize_t off = 0; off < len;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf.data() + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        // Whatever comes after a carried half other than its pair: that half moved away.
        if (!carried.empty() && !(ev->mask & IN_MOVED_TO)) SBX_RETURN_IF_ERROR(EmitMovedAway(carried));
        if (ev->mask & IN_Q_OVERFLOW) {
          SBX_RETURN_IF_ERROR(Emit(Event("overflow", top_, true)));
          continue;
        }
        auto it = dirs_.find(ev->wd);
        if (it == dirs_.end()) continue;
        if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
          if (it->second.path == top_) return absl::OkStatus();  // nothing left to watch
          continue;
        }
        if (ev->mask & IN_IGNORED) {
          dirs_.erase(it);
          continue;
        }
        const std::string name = ev->len ? std::string(ev->name) : std::string();
        const std::string path =
            name.empty() ? it->second.path
                         : (it->second.path == "/" ? "/" + name : it->second.path + "/" + name);
        const bool is_dir = ev->mask & IN_ISDIR;
        if (ev->mask & IN_CREATE) {
          if (is_dir && recursive_) AddChild(it->second.fd.get(), name, path);
          SBX_RETURN_IF_ERROR(Emit(Event("create", path, is_dir)));
        } else if (ev->mask & IN_CLOSE_WRITE) {
          SBX_RETURN_IF_ERROR(Emit(Event("modify", path, is_dir)));
        } else if (ev->mask & IN_DELETE) {
          SBX_RETURN_IF_ERROR(Emit(Event("delete", path, is_dir)));
        } else if (ev->mask & IN_MOVED_FROM) {
          moved_from[ev->cookie] = {path, is_dir};
        } else if (ev->mask & IN_MOVED_TO) {
          if (is_dir && recursive_) AddChild(it->second.fd.get(), name, path);
          auto from = moved_from.find(ev->cookie);
          auto& half = from != moved_from.end() ? moved_from : carried;
          if (from == moved_from.end()) from = carried.find(ev->cookie);
          Json e = Event(from != half.end() ? "move" : "create", path, is_dir);
          if (from != half.end()) {
            e["from"] = from->second.first;
            half.erase(from);
          }
          SBX_RETURN_IF_ERROR(Emit(e));
        }
      }
      SBX_RETURN_IF_ERROR(EmitMovedAway(carried));
      if (!moved_from.empty()) pair_until = std::chrono::steady_clock::now() + kMovePairWait;
    }
  }

 private:
  struct Dir {
    std::string path;
    UniqueFd fd;  // O_PATH, for the subdirectories created later
  };

  static Json Event(const char* type, const std::string& path, bool is_dir) {
    return protocol::WatchEvent{type, path, is_dir, std::nullopt}.ToJson();
  }
  absl::Status Emit(const Json& e) { return c_.SendJson(FrameType::kData, e); }
  // Moved out of the watched tree (no IN_MOVED_TO came): gone from here.
  absl::Status EmitMovedAway(std::map<uint32_t, std::pair<std::string, bool>>& halves) {
    for (const auto& [cookie, pd] : halves) SBX_RETURN_IF_ERROR(Emit(Event("delete", pd.first, pd.second)));
    halves.clear();
    return absl::OkStatus();
  }

  static constexpr std::chrono::milliseconds kMovePairWait{200};

  absl::Status Add(int dir_fd, const std::string& path, bool top) {
    if (dirs_.size() >= kMaxWatches) return absl::OkStatus();  // the rest goes unwatched
    // The resolved directory through its fd, so that nothing is looked up by name again.
    const std::string proc = fmt::format("/proc/self/fd/{}", dir_fd);
    const uint32_t mask = IN_CREATE | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                          IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;
    int wd = ::inotify_add_watch(ino_.get(), proc.c_str(), mask);
    if (wd < 0) {
      if (!top) return absl::OkStatus();  // a subdirectory that vanished or cannot be watched
      return FileErrnoStatus(errno, fmt::format("watch {}: inotify_add_watch", path));
    }
    if (top) top_ = path;
    UniqueFd own(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
    if (recursive_) {
      UniqueFd rd(::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      DIR* d = rd ? ::fdopendir(rd.get()) : nullptr;
      if (d) {
        rd.Release();
        std::vector<std::string> subdirs;
        while (dirent* de = ::readdir(d)) {
          const std::string n = de->d_name;
          // No more than can still be watched: a guest's directory may hold millions.
          if (dirs_.size() + subdirs.size() >= kMaxWatches) break;
          if (n != "." && n != ".." && de->d_type == DT_DIR) subdirs.push_back(n);
        }
        ::closedir(d);
        dirs_[wd] = Dir{path, std::move(own)};
        for (const std::string& n : subdirs) {
          AddChild(dirs_[wd].fd.get(), n, path == "/" ? "/" + n : path + "/" + n);
        }
        return absl::OkStatus();
      }
    }
    dirs_[wd] = Dir{path, std::move(own)};
    return absl::OkStatus();
  }

  void AddChild(int parent_fd, const std::string& name, const std::string& path) {
    // A guest can nest directories far past PATH_MAX (openat chains). Below kMaxPathBytes
    // every event path (a watched path, '/', a name of <= 255 bytes) stays under
    // kMaxFieldBytes and each kData event far under its frame bound; the watches' paths then
    // hold at most kMaxWatches * kMaxPathBytes, and the recursion through Add() ends there.
    if (path.size() > kMaxPathBytes) return;
    UniqueFd sub(::openat(parent_fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub) (void)Add(sub.get(), path, false);
  }

  Conn& c_;
  bool recursive_;
  UniqueFd ino_;
  std::string top_;
  std::map<int, Dir> dirs_;  // by watch descriptor
};

}  // namespace

absl::Status OpWatch(Conn& c, const protocol::WatchRequest& req, const FileOptions& o) {
  auto dir = OpenPath(req.path, o, O_PATH | O_DIRECTORY, "watch");
  if (!dir.ok()) return c.Fail(kResponse, dir.status());
  Watcher w(c, req.recursive);
  if (auto s = w.Init(dir->fd.get(), dir->path); !s.ok()) return c.Fail(kResponse, s);
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, protocol::OkReply{}.ToJson()));
  absl::Status s = w.Run();
  (void)c.SendJson(FrameType::kEnd, s.ok() ? protocol::OkReply{}.ToJson() : ErrorJson(s));
  return s;
}

}  // namespace sbx::agent::fileops
