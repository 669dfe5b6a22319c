// The content-addressed layer store (image.h): <root>/layers/sha256/<hex> trees, their
// metadata in <root>/meta/<hex>.json, the blobs they came from in <root>/blobs/<hex> (when
// kept), work in progress in <root>/tmp.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/files.h"
#include "common/ids.h"
#include "common/status_util.h"
#include "image/image.h"
#include "image/layer_unpack.h"

namespace sbx::image {
namespace {

absl::Status Mkdir(const std::string& p, mode_t mode) {
  if (::mkdir(p.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, fmt::format("layer store: mkdir({})", p));
  }
  return absl::OkStatus();
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

bool IsHex64(const std::string& s) {
  return IsDigest("sha256:" + s);
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("layer store: open({})", tmp));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  ::close(fd);
  if (!ok) return ErrnoStatus(err, fmt::format("layer store: write({})", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("layer store: rename({})", path));
  }
  return absl::OkStatus();
}

class LayerStoreImpl : public LayerStore {
 public:
  LayerStoreImpl(std::string root, Limits limits) : root_(std::move(root)), limits_(limits) {}

  absl::Status Init() {
    SBX_RETURN_IF_ERROR(Mkdir(root_, 0700));
    // A template may hold setuid files: nobody but root walks into the store.
    if (::chmod(root_.c_str(), 0700) != 0) {
      return ErrnoStatus(errno, fmt::format("layer store: chmod({})", root_));
    }
    SBX_RETURN_IF_ERROR(Mkdir(root_ + "/layers", 0700));
    SBX_RETURN_IF_ERROR(Mkdir(root_ + "/layers/sha256", 0700));
    SBX_RETURN_IF_ERROR(Mkdir(root_ + "/meta", 0700));
    SBX_RETURN_IF_ERROR(Mkdir(root_ + "/tmp", 0700));
    SBX_RETURN_IF_ERROR(Mkdir(root_ + "/blobs", 0700));
    Load();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> TreeOf(const std::string& diff_id) const override {
    std::lock_guard lock(mu_);
    if (!layers_.count(diff_id)) {
      return absl::NotFoundError(fmt::format("layer {} is not in the layer store", diff_id));
    }
    return Tree(diff_id);
  }

  bool Has(const std::string& diff_id) const override {
    std::lock_guard lock(mu_);
    return layers_.count(diff_id) > 0;
  }

  absl::StatusOr<LayerInfo> Put(const std::string& blob_path, const std::string& diff_id,
                                uint64_t max_bytes, const ProgressFn& progress,
                                const CancelFn& cancelled) override {
    if (!IsDigest(diff_id)) {
      return absl::InvalidArgumentError(fmt::format("layer: bad diff_id \"{:.80}\"", diff_id));
    }
    {
      // One unpack per layer at a time: a second import that needs it waits for the first.
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !busy_.count(diff_id); });
      if (auto it = layers_.find(diff_id); it != layers_.end()) {
        const LayerInfo have = it->second;
        lock.unlock();
        // Its blob is not kept from here: nothing verifies this one (the tree is not unpacked
        // again), and what other nodes are given must hash to the diff_id.
        return have;
      }
      busy_.insert(diff_id);
    }
    auto result = Unpack(blob_path, diff_id, max_bytes, progress, cancelled);
    // Only a blob whose tree verified: what other nodes are given always hashes to its diff_id.
    if (result.ok() && limits_.keep_blobs) KeepBlob(blob_path, diff_id);
    {
      std::lock_guard lock(mu_);
      busy_.erase(diff_id);
      if (result.ok()) layers_[diff_id] = *result;
    }
    cv_.notify_all();
    return result;
  }

  std::vector<LayerInfo> List() const override {
    std::lock_guard lock(mu_);
    std::vector<LayerInfo> out;
    for (const auto& [id, info] : layers_) out.push_back(info);
    return out;
  }

  uint64_t UsedBytes() const override {
    std::lock_guard lock(mu_);
    uint64_t n = 0;
    for (const auto& [id, info] : layers_) n += info.unpacked_bytes;
    return n;
  }

  absl::StatusOr<std::string> BlobOf(const std::string& diff_id) const override {
    if (!IsDigest(diff_id)) {
      return absl::InvalidArgumentError(fmt::format("layer: bad diff_id \"{:.80}\"", diff_id));
    }
    {
      std::lock_guard lock(mu_);
      if (!layers_.count(diff_id)) {
        return absl::NotFoundError(fmt::format("layer {} is not in the layer store", diff_id));
      }
    }
    if (!BlobKept(diff_id)) {
      return absl::NotFoundError(fmt::format(
          "layer {} is here but not its blob (unpacked before this node kept blobs)", diff_id));
    }
    return Blob(diff_id);
  }

  absl::Status Remove(const std::string& diff_id) override {
    std::string gone;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !busy_.count(diff_id); });
      if (!layers_.count(diff_id)) return absl::OkStatus();
      // Out of the store's name space first: a crash in the removal leaves only tmp/.
      gone = fmt::format("{}/tmp/rm-{}", root_, NewId("l"));
      if (::rename(Tree(diff_id).c_str(), gone.c_str()) != 0) {
        return ErrnoStatus(errno, fmt::format("layer store: rename({})", Tree(diff_id)));
      }
      ::unlink(Meta(diff_id).c_str());
      ::unlink(Blob(diff_id).c_str());
      layers_.erase(diff_id);
    }
    return RemoveTree(gone);
  }

  absl::Status Sweep() override {
    for (const std::string& n : Names(root_ + "/tmp")) {
      if (absl::Status st = RemoveTree(root_ + "/tmp/" + n); !st.ok()) return st;
    }
    std::set<std::string> trees, metas;
    for (const std::string& n : Names(root_ + "/layers/sha256")) trees.insert(n);
    for (const std::string& n : Names(root_ + "/meta")) {
      const size_t dot = n.find('.');
      if (dot != std::string::npos && n.substr(dot) == ".json") metas.insert(n.substr(0, dot));
      if (dot == std::string::npos || n.substr(dot) != ".json") ::unlink((root_ + "/meta/" + n).c_str());
    }
    for (const std::string& t : trees) {
      if (!metas.count(t) || !IsHex64(t)) {
        spdlog::warn("layer store: removing {}, which a crash left without its metadata", t);
        SBX_RETURN_IF_ERROR(RemoveTree(root_ + "/layers/sha256/" + t));
      }
    }
    for (const std::string& m : metas) {
      if (!trees.count(m)) ::unlink((root_ + "/meta/" + m + ".json").c_str());
    }
    // Half-copied blobs, and blobs whose layer a crash removed.
    for (const std::string& b : Names(root_ + "/blobs")) {
      if (!IsHex64(b) || !trees.count(b) || !metas.count(b)) ::unlink((root_ + "/blobs/" + b).c_str());
    }
    std::lock_guard lock(mu_);
    layers_.clear();
    Load();
    return absl::OkStatus();
  }

  const Limits& limits() const override { return limits_; }

 private:
  std::string Tree(const std::string& diff_id) const {
    return root_ + "/layers/sha256/" + diff_id.substr(7);
  }
  std::string Meta(const std::string& diff_id) const {
    return root_ + "/meta/" + diff_id.substr(7) + ".json";
  }
  std::string Blob(const std::string& diff_id) const {
    return root_ + "/blobs/" + diff_id.substr(7);
  }
  bool BlobKept(const std::string& diff_id) const {
    struct stat st {};
    return ::stat(Blob(diff_id).c_str(), &st) == 0 && S_ISREG(st.st_mode);
  }

  // A hard link when the blob is on the store's file system (an upload, a pull, a build's
  // layer: all under the state dir), else a copy. Failing only costs other nodes this source,
  // so it is logged, not returned.
  void KeepBlob(const std::string& blob_path, const std::string& diff_id) const {
    const std::string tmp = fmt::format("{}/blobs/tmp-{}-{}", root_, diff_id.substr(7, 12), NewId("b"));
    absl::Status st = absl::OkStatus();
    if (::linkat(AT_FDCWD, blob_path.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      st = CopyFile(blob_path, tmp);
    }
    if (st.ok() && ::rename(tmp.c_str(), Blob(diff_id).c_str()) != 0) {
      st = ErrnoStatus(errno, fmt::format("layer store: rename({})", Blob(diff_id)));
    }
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      spdlog::warn("layer store: the blob of {} is not kept, other nodes cannot fetch it from "
                   "here: {}", diff_id, std::string(st.message()));
    }
  }

  static absl::Status CopyFile(const std::string& from, const std::string& to) {
    const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return ErrnoStatus(errno, fmt::format("layer store: open({})", from));
    const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (out < 0) {
      const int err = errno;
      ::close(in);
      return ErrnoStatus(err, fmt::format("layer store: open({})", to));
    }
    absl::Status st = absl::OkStatus();
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(in, buf, sizeof buf);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        st = ErrnoStatus(errno, fmt::format("layer store: read({})", from));
        break;
      }
      if (::write(out, buf, static_cast<size_t>(n)) != n) {
        st = ErrnoStatus(errno, fmt::format("layer store: write({})", to));
        break;
      }
    }
    ::close(in);
    ::close(out);
    return st;
  }

  // Every layer with both its tree and its metadata (mu_ held, or before any use).
  void Load() {
    for (const std::string& n : Names(root_ + "/meta")) {
      if (n.size() != 64 + 5 || n.substr(64) != ".json" || !IsHex64(n.substr(0, 64))) continue;
      const std::string diff_id = "sha256:" + n.substr(0, 64);
      struct stat st {};
      if (::lstat(Tree(diff_id).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      auto text = ReadFileToString(root_ + "/meta/" + n);
      if (!text.ok()) continue;
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (!j.is_object()) continue;
      LayerInfo info;
      info.diff_id = diff_id;
      info.unpacked_bytes = j.value("unpacked_bytes", uint64_t{0});
      info.entries = j.value("entries", uint64_t{0});
      layers_[diff_id] = info;
    }
  }

  absl::StatusOr<LayerInfo> Unpack(const std::string& blob_path, const std::string& diff_id,
                                   uint64_t max_bytes, const ProgressFn& progress,
                                   const CancelFn& cancelled) {
    const std::string work = fmt::format("{}/tmp/{}-{}", root_, diff_id.substr(7, 12), NewId("l"));
    SBX_RETURN_IF_ERROR(Mkdir(work, 0755));
    UnpackLimits ul;
    ul.max_bytes = max_bytes;
    ul.max_entries = limits_.max_entries_per_layer;
    if (limits_.max_store_bytes > 0) {
      const uint64_t used = UsedBytes();
      const uint64_t left = used >= limits_.max_store_bytes ? 0 : limits_.max_store_bytes - used;
      if (left < ul.max_bytes) ul.max_bytes = left;
    }
    auto res = UnpackLayer(blob_path, work, diff_id, ul, progress, cancelled);
    auto fail = [&](absl::Status st) -> absl::Status {
      if (absl::Status rm = RemoveTree(work); !rm.ok()) {
        spdlog::warn("layer store: {} (left for the next start-up's sweep)",
                     std::string(rm.message()));
      }
      return st;
    };
    if (!res.ok()) {
      absl::Status st = res.status();
      if (absl::IsResourceExhausted(st) && ul.max_bytes < max_bytes) {
        st = absl::ResourceExhaustedError(fmt::format(
            "{} (the layer store is at its limit, templates.max_store_mib: `sbx template gc` "
            "frees what nothing uses)",
            std::string(st.message())));
      }
      return fail(st);
    }
    LayerInfo info;
    info.diff_id = diff_id;
    info.unpacked_bytes = res->unpacked_bytes;
    info.entries = res->entries;
    nlohmann::json meta = {{"diff_id", diff_id},
                           {"unpacked_bytes", info.unpacked_bytes},
                           {"entries", info.entries},
                           {"skipped", res->skipped}};
    if (absl::Status st = WriteFileAtomic(Meta(diff_id), meta.dump()); !st.ok()) return fail(st);
    if (::rename(work.c_str(), Tree(diff_id).c_str()) != 0) {
      const int err = errno;
      ::unlink(Meta(diff_id).c_str());
      return fail(ErrnoStatus(err, fmt::format("layer store: rename({})", Tree(diff_id))));
    }
    if (progress) {
      Progress p;
      p.stage = "unpacking";
      p.message = fmt::format("layer {} unpacked: {} entries, {:.1f} MiB", diff_id.substr(0, 19),
                              info.entries, static_cast<double>(info.unpacked_bytes) / (1 << 20));
      progress(p);
    }
    return info;
  }

  const std::string root_;
  const Limits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, LayerInfo> layers_;
  std::set<std::string> busy_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerStore>> LayerStore::Open(const std::string& root,
                                                             Limits limits) {
  auto store = std::make_unique<LayerStoreImpl>(root, limits);
  SBX_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<LayerStore>(std::move(store));
}

}  // namespace sbx::image
