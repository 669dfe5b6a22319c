#include "runtime/microvm/tree_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "common/digest.h"
#include "common/files.h"
#include "common/process.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::runtime::microvm {
namespace fs = std::filesystem;

namespace {
constexpr uint64_t kBlock = 4096;
constexpr uint64_t kInodeBytes = 256;
}  // namespace

absl::StatusOr<TreeSize> MeasureTree(const std::string& tree) {
  TreeSize s;
  std::error_code ec;
  fs::recursive_directory_iterator it(tree, fs::directory_options::none, ec);
  if (ec) return absl::NotFoundError(fmt::format("tree image: read {}: {}", tree, ec.message()));
  s.inodes = 1;
  s.data_bytes = kBlock;
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InternalError(fmt::format("tree image: walk {}: {}", tree, ec.message()));
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0) continue;  // gone meanwhile
    ++s.inodes;
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode)) {
      s.data_bytes += (static_cast<uint64_t>(st.st_size) + kBlock - 1) / kBlock * kBlock;
    }
  }
  return s;
}

int64_t TreeImageMib(const TreeSize& s) {
  const uint64_t inodes = s.inodes + s.inodes / 8 + 64;
  // Extent trees, directory indexes, group descriptors and bitmaps: about 3% of the data here,
  // plus a fixed 8 MiB; then 10% on top, since a full image fails the copy.
  const uint64_t bytes = s.data_bytes + inodes * kInodeBytes + s.data_bytes / 32 + (8u << 20);
  return static_cast<int64_t>((bytes + bytes / 10 + (1u << 20) - 1) >> 20);
}

absl::StatusOr<std::string> TreeImage(const std::string& tree, const std::string& cache_dir) {
  struct stat root;
  if (::stat(tree.c_str(), &root) != 0) return ErrnoStatus(errno, fmt::format("tree image: stat({})", tree));
  if (!S_ISDIR(root.st_mode)) return absl::InvalidArgumentError(fmt::format("tree image: {} is not a directory", tree));
  const std::string key = Sha256Hex(fmt::format("{}\n{}:{}:{}.{}", tree, root.st_dev, root.st_ino,
                                                root.st_ctim.tv_sec, root.st_ctim.tv_nsec))
                              .substr(0, 32);
  const std::string image = fmt::format("{}/tree-{}.img", cache_dir, key);
  if (::access(image.c_str(), R_OK) == 0) return image;

  SBX_ASSIGN_OR_RETURN(std::string mke2fs, FindProgram("mke2fs"));
  SBX_ASSIGN_OR_RETURN(TreeSize size, MeasureTree(tree));
  const int64_t mib = TreeImageMib(size);
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  const std::string tmp = fmt::format("{}/.tmp-tree-{}-{}.img", cache_dir, key, ::getpid());
  ::unlink(tmp.c_str());
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) return ErrnoStatus(errno, fmt::format("tree image: open({})", tmp));
    if (::ftruncate(fd.get(), mib << 20) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return ErrnoStatus(e, fmt::format("tree image: ftruncate({}, {} MiB)", tmp, mib));
    }
  }
  // Read-only for good: no journal, no reserved blocks, no room to grow; one inode per file
  // (and some spare) instead of mke2fs's one per 16 KiB.
  const std::vector<std::string> argv = {
      mke2fs, "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-m", "0",
      "-N", std::to_string(size.inodes + size.inodes / 8 + 64),
      "-O", "^has_journal,^resize_inode",
      "-E", "lazy_itable_init=1,root_owner=0:0",
      "-d", tree, tmp};
  std::string output;
  auto rc = RunProgram(argv, &output);
  if (!rc.ok() || *rc != 0) {
    ::unlink(tmp.c_str());
    if (!rc.ok()) return Annotate(rc.status(), "tree image");
    while (!output.empty() && output.back() == '\n') output.pop_back();
    return absl::InternalError(fmt::format("tree image: {} -d {} ({} MiB) exited with status {}: {}", mke2fs,
                                           tree, mib, *rc, output));
  }
  // Every VMM reads it under its own uid (each only the images bound into its jail).
  if (::chmod(tmp.c_str(), 0644) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(e, fmt::format("tree image: chmod({})", tmp));
  }
  if (::rename(tmp.c_str(), image.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(e, fmt::format("tree image: rename({}, {})", tmp, image));
  }
  return image;
}

std::vector<std::string> SweepSharedAssets(const std::string& assets_dir, const std::string& vm_root,
                                           int64_t min_age_s) {
  // Everything any VM's records name; the paths are absolute, so a substring test suffices.
  std::string named;
  std::error_code ec;
  for (const auto& vm : fs::directory_iterator(vm_root, ec)) {
    for (const char* record : {"/vm.json", "/jail.json"}) {
      named += ReadFileOrEmpty(vm.path().string() + record);
      named += '\n';
    }
  }
  const auto now = fs::file_time_type::clock::now();
  std::vector<std::string> removed;
  auto sweep = [&](const fs::path& p, bool dir) {
    const std::string path = p.string();
    if (named.find(path) != std::string::npos) return;
    std::error_code e;
    if (!dir && fs::hard_link_count(p, e) > 1) return;  // linked into a Firecracker root
    const auto mtime = fs::last_write_time(p, e);
    if (e || now - mtime < std::chrono::seconds(min_age_s)) return;
    fs::remove_all(p, e);
    if (!e) removed.push_back(path);
  };
  for (const auto& f : fs::directory_iterator(assets_dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("tree-", 0) == 0 && f.path().extension() == ".img") sweep(f.path(), false);
  }
  for (const auto& v : fs::directory_iterator(fs::path(assets_dir) / "views", ec)) sweep(v.path(), true);
  return removed;
}

}  // namespace sbx::runtime::microvm
