#include "archive/untar.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include <fmt/format.h>

#include "common/path_resolve.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::archive {

// Creates every missing directory of `path` (like mkdir -p), each resolved inside the root.
absl::Status MkdirParents(int root_fd, const std::string& path, mode_t mode,
                          std::optional<std::pair<uid_t, gid_t>> owner) {
  size_t pos = 1;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    const std::string prefix = path.substr(0, slash);
    pos = slash + 1;
    auto existing = OpenInRoot(root_fd, prefix, O_PATH | O_DIRECTORY, 0, "mkdir");
    if (existing.ok()) continue;
    if (!absl::IsNotFound(existing.status())) return existing.status();
    SBX_ASSIGN_OR_RETURN(ParentRef p, OpenParent(root_fd, prefix));
    if (::mkdirat(p.dir.get(), p.name.c_str(), mode) != 0) {
      if (errno == EEXIST) continue;
      return FileErrnoStatus(errno, fmt::format("mkdir {}: mkdirat", prefix));
    }
    if (owner && ::fchownat(p.dir.get(), p.name.c_str(), owner->first, owner->second,
                            AT_SYMLINK_NOFOLLOW) != 0) {
      return FileErrnoStatus(errno, fmt::format("mkdir {}: fchownat", prefix));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileErrnoStatus(errno, fmt::format("write {}: write", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Extracts a tar stream under `base` (an O_PATH fd). Every entry is resolved with `base` as
// the root (RESOLVE_IN_ROOT), so `..`, absolute names and symlinks planted by earlier entries
// cannot reach outside it; names that climb above it are refused, and hard links may name only
// the regular files this archive made.
class Extractor::Impl {
 public:
  Impl(int base, std::string base_path, std::optional<uint64_t> max_bytes)
      : base_(base), base_path_(std::move(base_path)), max_bytes_(max_bytes) {}

  absl::Status OnEntry(const TarEntry& e) {
    absl::Status s = Create(e);
    // A path the archive itself made unusable (through a dangling symlink, or a file where a
    // directory should be) is the archive's fault, not a missing file of the sandbox.
    if (absl::IsNotFound(s) || ApiErrorCode(s) == "not_a_directory") {
      return Refuse(e, fmt::format("cannot be created: {}", std::string(s.message())));
    }
    return s;
  }

  absl::Status Create(const TarEntry& e) {
    if (e.name[0] == '/') return Refuse(e, "has an absolute name");
    auto norm = ValidatePath(e.name, "/");
    if (!norm.ok()) return Refuse(e, std::string(norm.status().message()));
    ++entries_;
    const std::string shown = base_path_ + (*norm == "/" ? "" : *norm);
    switch (e.type) {
      case TarType::kDirectory: {
        if (*norm == "/") return absl::OkStatus();
        SBX_RETURN_IF_ERROR(MkdirParents(base_, *norm, (e.mode & 07777) | 0700, owner_));
        if (!owner_) return absl::OkStatus();
        SBX_ASSIGN_OR_RETURN(UniqueFd d, OpenInRoot(base_, *norm, O_PATH | O_DIRECTORY, 0, "untar"));
        return Chown(d.get(), "", shown);
      }
      case TarType::kFile: {
        SBX_ASSIGN_OR_RETURN(ParentRef p, PrepareLeaf(*norm, shown));
        file_.Reset(::openat(p.dir.get(), p.name.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!file_) return FileErrnoStatus(errno, fmt::format("untar {}: openat", shown));
        file_pos_ = 0;
        file_mode_ = e.mode & 07777;
        file_mtime_ = e.mtime;
        file_path_ = shown;
        Remember(*norm);
        return absl::OkStatus();
      }
      case TarType::kSymlink: {
        SBX_ASSIGN_OR_RETURN(ParentRef p, PrepareLeaf(*norm, shown));
        if (::symlinkat(e.linkname.c_str(), p.dir.get(), p.name.c_str()) != 0) {
          return FileErrnoStatus(errno, fmt::format("untar {}: symlinkat", shown));
        }
        Forget(*norm);
        return owner_ ? Chown(p.dir.get(), p.name, shown) : absl::OkStatus();
      }
      case TarType::kHardLink: {
        auto target = ValidatePath(e.linkname, "/");
        if (!target.ok() || !files_.contains(*target)) {
          return Refuse(e, fmt::format("is a hard link to \"{:.200}\", which is not a file made "
                                       "earlier by this archive{}",
                                       e.linkname,
                                       targets_full_
                                           ? fmt::format(" (only the first {} bytes of file names "
                                                         "are kept as link targets)",
                                                         link_target_budget_)
                                           : ""));
        }
        // Both sides by their parent's fd (resolved in the root) and a last component that
        // linkat does not follow: neither end can be steered out of the tree.
        SBX_ASSIGN_OR_RETURN(ParentRef from, OpenParent(base_, *target));
        SBX_ASSIGN_OR_RETURN(ParentRef p, PrepareLeaf(*norm, shown));
        if (::linkat(from.dir.get(), from.name.c_str(), p.dir.get(), p.name.c_str(), 0) != 0) {
          return FileErrnoStatus(errno, fmt::format("untar {}: linkat", shown));
        }
        Remember(*norm);
        return absl::OkStatus();
      }
      default:
        --entries_;  // devices, FIFOs: skipped
        ++skipped_;
        return absl::OkStatus();
    }
  }

  // Every entry of `reader`, then the end of the archive.
  absl::Status Extract(TarReader& reader) {
    for (;;) {
      SBX_ASSIGN_OR_RETURN(std::optional<TarEntry> e, reader.Next());
      if (!e) return absl::OkStatus();
      SBX_RETURN_IF_ERROR(OnEntry(*e));
      for (;;) {
        SBX_ASSIGN_OR_RETURN(TarReader::Piece piece, reader.Read());
        if (piece.bytes.empty()) break;
        SBX_RETURN_IF_ERROR(OnData(piece.offset, piece.bytes));
      }
      SBX_RETURN_IF_ERROR(OnEndEntry(e->size));
    }
  }

  void SetOwner(uid_t uid, gid_t gid) { owner_ = std::make_pair(uid, gid); }
  void SetLinkTargetBudget(size_t bytes) { link_target_budget_ = bytes; }
  int entries() const { return entries_; }
  int skipped() const { return skipped_; }

 private:
  // A sparse entry's holes count like data: the file is that long once extracted.
  absl::Status OnData(uint64_t offset, std::string_view data) {
    SBX_RETURN_IF_ERROR(Charge((offset > file_pos_ ? offset - file_pos_ : 0) + data.size()));
    if (!file_) return absl::OkStatus();
    if (offset != file_pos_ &&
        ::lseek(file_.get(), static_cast<off_t>(offset), SEEK_SET) == static_cast<off_t>(-1)) {
      return FileErrnoStatus(errno, fmt::format("untar {}: lseek", file_path_));
    }
    file_pos_ = offset + data.size();
    return WriteAll(file_.get(), data, file_path_);
  }

  absl::Status OnEndEntry(uint64_t size) {
    if (!file_) return absl::OkStatus();
    if (size > file_pos_) {  // a sparse file ending in a hole
      SBX_RETURN_IF_ERROR(Charge(size - file_pos_));
      if (::ftruncate(file_.get(), static_cast<off_t>(size)) != 0) {
        return FileErrnoStatus(errno, fmt::format("untar {}: ftruncate", file_path_));
      }
    }
    if (owner_) SBX_RETURN_IF_ERROR(Chown(file_.get(), "", file_path_));
    // After the chown, which clears setuid and setgid bits.
    if (::fchmod(file_.get(), file_mode_) != 0) {
      return FileErrnoStatus(errno, fmt::format("untar {}: fchmod", file_path_));
    }
    const timespec times[2] = {{0, UTIME_OMIT}, {file_mtime_, 0}};
    (void)::futimens(file_.get(), times);
    if (file_.Close() != 0) return FileErrnoStatus(errno, fmt::format("untar {}: close", file_path_));
    return absl::OkStatus();
  }

  absl::Status Charge(uint64_t bytes) {
    total_ += bytes;
    if (max_bytes_ && total_ > *max_bytes_) {
      return ApiError(absl::StatusCode::kResourceExhausted, "payload_too_large",
                      fmt::format("untar {}: more than the sandbox's disk cap of {} bytes",
                                  base_path_, *max_bytes_));
    }
    return absl::OkStatus();
  }

  absl::Status Refuse(const TarEntry& e, std::string_view why) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_tar",
                    fmt::format("untar into {}: entry \"{}\" {}", base_path_, e.name, why));
  }

  // Parents created, and whatever non-directory is at the name removed (an archive's later
  // entry replaces an earlier one, as tar does).
  absl::StatusOr<ParentRef> PrepareLeaf(const std::string& norm, const std::string& shown) {
    if (norm == "/") {
      return ApiError(absl::StatusCode::kInvalidArgument, "invalid_tar",
                      fmt::format("untar into {}: an entry names the directory itself", base_path_));
    }
    SBX_ASSIGN_OR_RETURN(auto split, SplitParent(norm));
    SBX_RETURN_IF_ERROR(MkdirParents(base_, split.first, 0755, owner_));
    SBX_ASSIGN_OR_RETURN(ParentRef p, OpenParent(base_, norm));
    if (::unlinkat(p.dir.get(), p.name.c_str(), 0) != 0 && errno != ENOENT) {
      return FileErrnoStatus(errno, fmt::format("untar {}: unlinkat", shown));
    }
    return p;
  }

  // The names a hard link may point at, bounded: the archive may be a sandbox's (sbx cp of a
  // download), and millions of empty files must not become the extractor's memory.
  void Remember(const std::string& name) {
    if (files_.contains(name)) return;
    if (files_bytes_ + name.size() > link_target_budget_) {
      targets_full_ = true;
      return;
    }
    files_bytes_ += name.size();
    files_.insert(name);
  }
  void Forget(const std::string& name) {
    if (files_.erase(name) != 0) files_bytes_ -= name.size();
  }

  absl::Status Chown(int dir, const std::string& name, const std::string& shown) {
    const int flags = name.empty() ? AT_EMPTY_PATH : AT_SYMLINK_NOFOLLOW;
    if (::fchownat(dir, name.c_str(), owner_->first, owner_->second, flags) != 0) {
      return FileErrnoStatus(errno, fmt::format("untar {}: fchownat", shown));
    }
    return absl::OkStatus();
  }

  int base_;
  std::string base_path_;
  size_t link_target_budget_ = Extractor::kLinkTargetBytes;
  std::set<std::string> files_;  // regular files made so far: what a hard link may name
  size_t files_bytes_ = 0;       // the names' bytes in files_
  bool targets_full_ = false;    // a file was made but not remembered
  std::optional<std::pair<uid_t, gid_t>> owner_;
  std::optional<uint64_t> max_bytes_;
  uint64_t total_ = 0;
  int entries_ = 0, skipped_ = 0;
  UniqueFd file_;
  uint64_t file_pos_ = 0;  // where the next piece of file_ would go without a hole
  mode_t file_mode_ = 0644;
  int64_t file_mtime_ = 0;
  std::string file_path_;
};


Extractor::Extractor(int base, std::string base_path, std::optional<uint64_t> max_bytes)
    : impl_(std::make_unique<Impl>(base, std::move(base_path), max_bytes)) {}

Extractor::~Extractor() = default;

absl::Status Extractor::Run(const ByteSource& source) {
  absl::Status source_error;
  TarReader reader([&]() -> absl::StatusOr<std::string_view> {
    absl::StatusOr<std::string_view> piece = source();
    if (!piece.ok()) source_error = piece.status();
    return piece;
  });
  absl::Status s = impl_->Extract(reader);
  if (s.ok()) s = reader.Drain();
  if (!source_error.ok()) return source_error;
  // The reader's own errors are a malformed archive.
  if (!s.ok() && s.code() == absl::StatusCode::kInvalidArgument && ApiErrorCode(s).empty()) {
    return ApiError(s.code(), "invalid_tar", std::string(s.message()));
  }
  return s;
}

void Extractor::SetOwner(uid_t uid, gid_t gid) { impl_->SetOwner(uid, gid); }
void Extractor::SetLinkTargetBudget(size_t bytes) { impl_->SetLinkTargetBudget(bytes); }

int Extractor::entries() const { return impl_->entries(); }
int Extractor::skipped() const { return impl_->skipped(); }

}  // namespace sbx::archive
