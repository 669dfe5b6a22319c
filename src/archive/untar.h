// Extraction of a tar stream into a directory, contained in it: every entry is resolved with
// the directory as the root (openat2 RESOLVE_IN_ROOT, common/path_resolve.h), so absolute
// names, `..` and symlinks planted by earlier entries cannot reach outside it; names that climb
// above it are refused, devices and FIFOs skipped. A hard link may only name a regular file
// this archive made earlier: an archive cannot link (and so pin or expose) a file it did not
// bring. The archive is read by
// TarReader (libarchive); the file-system side is ours, because libarchive's own extraction
// (archive_write_disk) checks paths with lstat walks that a process of the sandbox changing the
// tree at the same time could race. Used by the agent (PUT of a tar) and by `sbx cp` (a
// download of a sandbox's directory, whose contents are untrusted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "archive/tar.h"

namespace sbx::archive {

// Creates every missing directory of `path` (like mkdir -p), each resolved inside `root_fd`;
// those it creates are given to `owner` when set.
absl::Status MkdirParents(int root_fd, const std::string& path, mode_t mode,
                          std::optional<std::pair<uid_t, gid_t>> owner = std::nullopt);

// Writes all of `data` to `fd`; errors name `path`.
absl::Status WriteAll(int fd, std::string_view data, const std::string& path);

class Extractor {
 public:
  // `base`: an O_PATH directory fd, kept open by the caller; `base_path` names it in errors.
  // `max_bytes`: a bound on the data extracted (the sandbox's disk cap).
  Extractor(int base, std::string base_path, std::optional<uint64_t> max_bytes);
  ~Extractor();

  // Extracts the archive `source` yields, then reads the source to its end. A malformed or
  // refused archive is InvalidArgument with the API code "invalid_tar"; an error of the source
  // is returned as it is.
  absl::Status Run(const ByteSource& source);
  // Every entry made from now on is owned by uid:gid instead of the extracting process (a
  // build's COPY --chown, a PUT with an owner); the archive's own owners are never used.
  void SetOwner(uid_t uid, gid_t gid);
  // The bytes of file names kept as hard-link targets (kLinkTargetBytes by default): past it a
  // file is still made, but a later hard link to it is refused and says why.
  void SetLinkTargetBudget(size_t bytes);
  static constexpr size_t kLinkTargetBytes = 16 << 20;
  int entries() const;
  int skipped() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx::archive
