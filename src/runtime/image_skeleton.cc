#include "runtime/image_skeleton.h"

#include <sys/stat.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::runtime {

absl::Status EnsureImageSkeleton(const std::string& dir) {
  struct Entry {
    const char* name;
    mode_t mode;
  };
  // tmp keeps its sticky bit once the sandbox's tmpfs is over it only if the image's /tmp is
  // shadowed by a directory of the right mode: the skeleton's is the topmost.
  static constexpr Entry kEntries[] = {{"", 0755},    {"proc", 0755}, {"dev", 0755},
                                       {"sys", 0755}, {"tmp", 01777}, {"etc", 0755},
                                       {"run", 0755}};
  for (const Entry& e : kEntries) {
    const std::string path = *e.name ? dir + "/" + e.name : dir;
    if (::mkdir(path.c_str(), e.mode) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, fmt::format("image skeleton: mkdir({})", path));
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      return ErrnoStatus(errno, fmt::format("image skeleton: lstat({})", path));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(fmt::format(
          "image skeleton: {} is not a directory (remove it; sbxd makes it again)", path));
    }
    // mkdir applies the umask; chmod sets what the overlay shows.
    if (::chmod(path.c_str(), e.mode) != 0) {
      return ErrnoStatus(errno, fmt::format("image skeleton: chmod({})", path));
    }
  }
  return absl::OkStatus();
}

}  // namespace sbx::runtime
