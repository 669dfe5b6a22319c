// The pieces the file operations (files.h) share: the worker's blocking frame I/O, entries, and
// the ops themselves, one file per kind: files_tree.cc (stat, list, mkdir, delete, move),
// files_transfer.cc (read, write), files_tar.cc (read_tar, write_tar), files_watch.cc (watch),
// export_layer.cc (export_layer).
// files.cc decodes the request once (protocol/messages.h) and hands each op its typed request.
// Not for use outside these files.
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/files.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"

namespace sbx::agent::fileops {

using protocol::EncodeFrame;
using protocol::Frame;
using protocol::FrameType;
using protocol::Json;
// An op's replies: the response, then (for a stream) kEnd.
using FrameType::kEnd;
using FrameType::kResponse;

inline constexpr int kMaxTreeDepth = 128;

// The message is cut: it embeds paths, some of them the guest's (a name deep in a tree being
// deleted or archived), and a response or kEnd must stay under its 64 KiB bound.
Json ErrorJson(const absl::Status& s);

// ---- blocking frame I/O on the worker's connection -----------------------------------------

class Conn {
 public:
  Conn(int fd, protocol::FrameDecoder rest) : fd_(fd), decoder_(std::move(rest)) {}

  absl::Status Send(FrameType type, std::string_view payload) {
    const std::string frame = EncodeFrame(type, payload);
    size_t off = 0;
    while (off < frame.size()) {
      ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "send to host");
      }
      off += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status SendJson(FrameType type, const Json& j) { return Send(type, protocol::DumpJson(j)); }
  // Sends `s` as the error reply (`type` kResponse while the op has not answered yet, kEnd
  // once it has) and returns `s`, the op's result: `return c.Fail(kResponse, s);`.
  absl::Status Fail(FrameType type, const absl::Status& s) {
    (void)SendJson(type, ErrorJson(s));
    return s;
  }
  int fd() const { return fd_; }
  // Hands over what was read from the host but not yet returned as frames: an upload then
  // reads the socket itself (files_transfer.cc), and Read() must not be called after this.
  std::string TakeBuffered() { return decoder_.TakeBuffered(); }

  absl::StatusOr<Frame> Read() {
    for (;;) {
      auto next = decoder_.Next();
      if (!next.ok()) return next.status();
      if (*next) return std::move(**next);
      ssize_t n = ::recv(fd_, buf_, sizeof(buf_), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "read from host");
      }
      if (n == 0) return absl::UnavailableError("host closed the connection mid-transfer");
      decoder_.Feed(std::string_view(buf_, static_cast<size_t>(n)));
    }
  }

 private:
  int fd_;
  protocol::FrameDecoder decoder_;
  char buf_[64 * 1024];
};

// ---- entries ---------------------------------------------------------------------------------

// `dir` + `name` is what `st` describes (lstat): the symlink target is read from there.
protocol::FileEntry EntryOf(const struct stat& st, std::string_view path, int dir,
                            const std::string& name);

// lstat of a resolved path: the entry describes the last component itself (a symlink is
// reported as one, not followed).
absl::StatusOr<protocol::FileEntry> StatEntry(int root_fd, const std::string& path);

// A request's path resolved (ValidatePath against o.workdir) and opened inside the root with
// `flags` (OpenInRoot; `what` names a failure).
struct OpenedPath {
  std::string path;
  UniqueFd fd;
};
absl::StatusOr<OpenedPath> OpenPath(const std::string& raw, const FileOptions& o, int flags,
                                    std::string_view what);

// The names in the directory `dir` but "." and "..", unsorted; read through a descriptor of
// its own, so `dir` stays as it was. `op` and `path` name the failure.
absl::StatusOr<std::vector<std::string>> DirNames(int dir, const char* op,
                                                  const std::string& path);

// ---- ops -------------------------------------------------------------------------------------
// Each resolves its request's paths with ValidatePath (common/path_resolve.h) against
// o.workdir: the reasons ("invalid_path", "path_outside_root", ...) are the agent's to give.

absl::StatusOr<Json> OpStat(const protocol::StatRequest& req, const FileOptions& o);
// The payload as text (bounded.h): entries <= kMaxListEntries, bytes <= kMaxGuestReplyBytes.
absl::StatusOr<std::string> OpList(const protocol::ListRequest& req, const FileOptions& o);
absl::StatusOr<Json> OpMkdir(const protocol::MkdirRequest& req, const FileOptions& o);
absl::StatusOr<Json> OpDelete(const protocol::DeleteRequest& req, const FileOptions& o);
absl::StatusOr<Json> OpMove(const protocol::MoveRequest& req, const FileOptions& o);

// read: the response, then the bytes, then kEnd. Errors before the response are returned;
// after it, they go into kEnd.
absl::Status OpRead(Conn& c, const protocol::ReadRequest& req, const FileOptions& o);
absl::Status OpWrite(Conn& c, const protocol::WriteRequest& req, const FileOptions& o);
absl::Status OpReadTar(Conn& c, const protocol::ReadRequest& req, const FileOptions& o);
absl::Status OpWriteTar(Conn& c, const protocol::WriteRequest& req, const FileOptions& o);
// export_layer.cc: a microVM build step's writable layer.
absl::Status OpExportLayer(Conn& c, const protocol::ExportLayerRequest& req, const FileOptions& o);

// The owner a write asks for: uid/gid given, or `user` ("name", "uid", "name:group",
// "uid:gid") resolved through the sandbox's own /etc/passwd and /etc/group; unset fields keep
// the writer's. unknown_user when the name resolves to nothing.
struct Owner {
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
};
absl::StatusOr<Owner> RequestOwner(const protocol::WriteRequest& req, const FileOptions& o);
absl::StatusOr<Owner> UserOwner(const std::optional<std::string>& user, const FileOptions& o);
// What MkdirParents takes: the directories a write or mkdir makes go to its owner, as
// `mkdir -p` run by that user would leave them (the user can write into them).
std::optional<std::pair<uid_t, gid_t>> DirOwner(const Owner& owner);
absl::Status OpWatch(Conn& c, const protocol::WatchRequest& req, const FileOptions& o);

}  // namespace sbx::agent::fileops
