// ImportArchive and ImportLayout (image.h): the documents of an image read and verified, its
// layers handed to the LayerStore.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "archive/untar.h"
#include "common/digest.h"
#include "common/path_resolve.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "image/image.h"
#include "image/layer_unpack.h"
#include "image/oci.h"

namespace sbx::image {
namespace {

using json = nlohmann::json;
constexpr size_t kChunk = 1 << 20;

// A file of an image opened inside `root` (RESOLVE_IN_ROOT: a symlink the archive planted
// cannot lead out of it), which must be a regular file.
absl::StatusOr<UniqueFd> OpenBlob(int root, const std::string& rel, bool follow_last) {
  SBX_ASSIGN_OR_RETURN(
      UniqueFd fd, OpenInRoot(root, "/" + rel, O_RDONLY | O_CLOEXEC | (follow_last ? 0 : O_NOFOLLOW),
                              0, "image: open " + rel));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "image: fstat " + rel);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(fmt::format("image: {} is not a regular file", rel));
  }
  return fd;
}

// A path of manifest.json, relative to the archive's root.
absl::StatusOr<std::string> CleanArchivePath(const std::string& p) {
  auto v = ValidatePath(p, "/");
  if (!v.ok() || *v == "/") {
    return absl::InvalidArgumentError(fmt::format("image: bad path \"{:.100}\" in manifest.json", p));
  }
  if (p.find("..") != std::string::npos) {
    return absl::InvalidArgumentError(fmt::format("image: path \"{:.100}\" climbs (..)", p));
  }
  return v->substr(1);
}

std::string BlobPath(const std::string& digest) { return "blobs/sha256/" + digest.substr(7); }

// The whole of a small document (at most the parsers' bound).
absl::StatusOr<std::string> ReadSmall(int fd, const std::string& what) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "image: read " + what);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > oci::kMaxDocumentBytes) {
      return absl::InvalidArgumentError(fmt::format("image: {} is larger than {} bytes", what,
                                                    oci::kMaxDocumentBytes));
    }
  }
  return out;
}

// A document blob of a layout, checked against its descriptor.
absl::StatusOr<std::string> ReadVerified(int root, const oci::Descriptor& d, const std::string& what) {
  if (d.size > oci::kMaxDocumentBytes) {
    return absl::InvalidArgumentError(fmt::format("image: {} {} claims {} bytes, more than {}",
                                                  what, d.digest, d.size, oci::kMaxDocumentBytes));
  }
  SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenBlob(root, BlobPath(d.digest), false));
  SBX_ASSIGN_OR_RETURN(std::string text, ReadSmall(fd.get(), what));
  if (text.size() != d.size) {
    return absl::DataLossError(fmt::format("image: {} {} is {} bytes, its descriptor says {}",
                                           what, d.digest, text.size(), d.size));
  }
  if (std::string got = Sha256Digest(text); got != d.digest) {
    return absl::DataLossError(fmt::format("image: {} {} hashes to {}", what, d.digest, got));
  }
  return text;
}

struct LayerSource {
  UniqueFd fd;        // the blob, opened inside the image's root
  std::string what;   // for messages
};

// Hands the layers to the store, bottom first, within the image's byte budget.
absl::StatusOr<std::vector<LayerInfo>> StoreLayers(std::vector<LayerSource>& blobs,
                                                   const std::vector<std::string>& diff_ids,
                                                   LayerStore& store, const ProgressFn& progress,
                                                   const CancelFn& cancelled,
                                                   uint64_t bytes_total) {
  std::vector<LayerInfo> out;
  uint64_t used = 0, read = 0;
  const uint64_t budget = store.limits().max_image_bytes;
  for (size_t i = 0; i < blobs.size(); ++i) {
    if (cancelled && cancelled()) return absl::CancelledError("image import: cancelled");
    auto report = [&](const Progress& inner) {
      if (!progress) return;
      Progress p = inner;
      p.layers_done = static_cast<int>(i);
      p.layers_total = static_cast<int>(blobs.size());
      p.bytes_done = read + inner.bytes_done;
      p.bytes_total = bytes_total;
      progress(p);
    };
    const std::string path = fmt::format("/proc/self/fd/{}", blobs[i].fd.get());
    auto info = store.Put(path, diff_ids[i], budget - used, report, cancelled);
    if (!info.ok()) {
      return Annotate(info.status(), fmt::format("layer {} of {} ({})", i + 1, blobs.size(),
                                                 blobs[i].what));
    }
    used += info->unpacked_bytes;
    if (used > budget) {
      return absl::ResourceExhaustedError(fmt::format(
          "image: its layers unpack to more than {} bytes (templates.max_image_mib)", budget));
    }
    struct stat st {};
    if (::fstat(blobs[i].fd.get(), &st) == 0) read += static_cast<uint64_t>(st.st_size);
    out.push_back(*info);
  }
  if (progress) {
    Progress p;
    p.stage = "done";
    p.layers_done = p.layers_total = static_cast<int>(blobs.size());
    p.bytes_done = p.bytes_total = bytes_total;
    progress(p);
  }
  return out;
}

absl::StatusOr<Image> ImportFromRoot(int root, const std::string& manifest_digest,
                                     const std::string& ref_name, LayerStore& store,
                                     const ProgressFn& progress, const CancelFn& cancelled) {
  oci::Descriptor chosen;
  if (!manifest_digest.empty()) {
    if (!IsDigest(manifest_digest)) {
      return absl::InvalidArgumentError("image: bad manifest digest " + manifest_digest);
    }
    SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenBlob(root, BlobPath(manifest_digest), false));
    struct stat st {};
    ::fstat(fd.get(), &st);
    chosen.digest = manifest_digest;
    chosen.size = static_cast<uint64_t>(st.st_size);
  } else {
    SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenBlob(root, "index.json", false));
    SBX_ASSIGN_OR_RETURN(std::string text, ReadSmall(fd.get(), "index.json"));
    SBX_ASSIGN_OR_RETURN(oci::Index index, oci::ParseIndex(text));
    SBX_ASSIGN_OR_RETURN(chosen, oci::Choose(index, ref_name));
    // A multi-platform image is an index inside the layout's index (skopeo --all, docker).
    for (int depth = 0; chosen.IsIndex(); ++depth) {
      if (depth >= 2) return absl::InvalidArgumentError("image: indexes nest too deep");
      SBX_ASSIGN_OR_RETURN(std::string inner, ReadVerified(root, chosen, "image index"));
      SBX_ASSIGN_OR_RETURN(oci::Index nested, oci::ParseIndex(inner));
      SBX_ASSIGN_OR_RETURN(chosen, oci::Choose(nested, ""));
    }
  }
  SBX_ASSIGN_OR_RETURN(std::string mtext, ReadVerified(root, chosen, "manifest"));
  SBX_ASSIGN_OR_RETURN(oci::Manifest manifest, oci::ParseManifest(mtext));
  SBX_ASSIGN_OR_RETURN(std::string ctext, ReadVerified(root, manifest.config, "config"));
  SBX_ASSIGN_OR_RETURN(oci::Config config, oci::ParseConfig(ctext));
  if (config.diff_ids.size() != manifest.layers.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "image: the manifest lists {} layers, the config {} diff_ids", manifest.layers.size(),
        config.diff_ids.size()));
  }
  std::vector<LayerSource> blobs;
  uint64_t total = 0;
  for (const auto& l : manifest.layers) total += l.size;
  for (size_t i = 0; i < manifest.layers.size(); ++i) {
    const oci::Descriptor& l = manifest.layers[i];
    SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenBlob(root, BlobPath(l.digest), false));
    // A layer the store holds is not read again: its diff_id, from the verified config, is
    // what the store checked when it unpacked it.
    if (!store.Has(config.diff_ids[i])) {
      if (progress) {
        Progress p;
        p.stage = "verifying";
        p.layers_done = static_cast<int>(i);
        p.layers_total = static_cast<int>(manifest.layers.size());
        p.bytes_total = total;
        progress(p);
      }
      SBX_ASSIGN_OR_RETURN(FileDigest h, Sha256OfFile(fd.get(), cancelled));
      if (h.size != l.size || h.digest != l.digest) {
        return absl::DataLossError(fmt::format(
            "image: layer {} is {} bytes hashing to {}; its descriptor says {} bytes", l.digest,
            h.size, h.digest, l.size));
      }
    }
    blobs.push_back(LayerSource{std::move(fd), l.digest});
  }
  SBX_ASSIGN_OR_RETURN(std::vector<LayerInfo> layers,
                       StoreLayers(blobs, config.diff_ids, store, progress, cancelled, total));
  Image img;
  img.digest = chosen.digest;
  img.config_digest = manifest.config.digest;
  img.layers = std::move(layers);
  img.config = std::move(config.config);
  img.config_json = oci::ConfigJson(img.config);
  return img;
}

// `docker save` and skopeo's docker-archive: manifest.json, a config file, layer tars. There
// is no registry manifest: one is made (OCI, canonical JSON of the config's and the layer
// files' digests and sizes) and its digest names the release, so the same archive imported
// twice is the same release.
absl::StatusOr<Image> ImportDockerArchive(int root, const std::string& ref_name,
                                          LayerStore& store, const ProgressFn& progress,
                                          const CancelFn& cancelled) {
  SBX_ASSIGN_OR_RETURN(UniqueFd mfd, OpenBlob(root, "manifest.json", false));
  SBX_ASSIGN_OR_RETURN(std::string mtext, ReadSmall(mfd.get(), "manifest.json"));
  SBX_ASSIGN_OR_RETURN(std::vector<oci::DockerImage> images, oci::ParseDockerManifest(mtext));
  const oci::DockerImage* img = nullptr;
  if (ref_name.empty()) {
    if (images.size() != 1) {
      return absl::InvalidArgumentError(fmt::format(
          "image: the archive holds {} images: name one (its RepoTags entry)", images.size()));
    }
    img = &images[0];
  } else {
    for (const auto& i : images) {
      for (const auto& t : i.repo_tags) {
        if (t == ref_name) img = &i;
      }
    }
    if (img == nullptr) {
      return absl::NotFoundError(fmt::format("image: no image tagged \"{:.100}\"", ref_name));
    }
  }
  SBX_ASSIGN_OR_RETURN(std::string crel, CleanArchivePath(img->config));
  SBX_ASSIGN_OR_RETURN(UniqueFd cfd, OpenBlob(root, crel, true));
  SBX_ASSIGN_OR_RETURN(std::string ctext, ReadSmall(cfd.get(), "config"));
  SBX_ASSIGN_OR_RETURN(oci::Config config, oci::ParseConfig(ctext));
  if (config.diff_ids.size() != img->layers.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "image: manifest.json lists {} layers, the config {} diff_ids", img->layers.size(),
        config.diff_ids.size()));
  }
  json manifest = {{"schemaVersion", 2},
                   {"mediaType", std::string(oci::kOciManifest)},
                   {"config",
                    {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                     {"digest", Sha256Digest(ctext)},
                     {"size", ctext.size()}}},
                   {"layers", json::array()}};
  std::vector<LayerSource> blobs;
  uint64_t total = 0;
  for (size_t i = 0; i < img->layers.size(); ++i) {
    SBX_ASSIGN_OR_RETURN(std::string rel, CleanArchivePath(img->layers[i]));
    SBX_ASSIGN_OR_RETURN(UniqueFd fd, OpenBlob(root, rel, true));
    SBX_ASSIGN_OR_RETURN(FileDigest h, Sha256OfFile(fd.get(), cancelled));
    unsigned char magic[4] = {};
    const ssize_t n = ::pread(fd.get(), magic, sizeof magic, 0);
    const char* type = "application/vnd.oci.image.layer.v1.tar";
    if (n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      type = "application/vnd.oci.image.layer.v1.tar+gzip";
    } else if (n >= 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f &&
               magic[3] == 0xfd) {
      type = "application/vnd.oci.image.layer.v1.tar+zstd";
    }
    manifest["layers"].push_back({{"mediaType", type}, {"digest", h.digest}, {"size", h.size}});
    total += h.size;
    blobs.push_back(LayerSource{std::move(fd), rel});
  }
  SBX_ASSIGN_OR_RETURN(std::vector<LayerInfo> layers,
                       StoreLayers(blobs, config.diff_ids, store, progress, cancelled, total));
  Image out;
  out.digest = Sha256Digest(manifest.dump());
  out.config_digest = Sha256Digest(ctext);
  out.layers = std::move(layers);
  out.config = std::move(config.config);
  out.config_json = oci::ConfigJson(out.config);
  return out;
}

}  // namespace

absl::StatusOr<Image> ImportLayout(const std::string& layout_dir,
                                   const std::string& manifest_digest, LayerStore& store,
                                   const ProgressFn& progress, const CancelFn& cancelled) {
  UniqueFd root(::open(layout_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) return ErrnoStatus(errno, fmt::format("image: open({})", layout_dir));
  return ImportFromRoot(root.get(), manifest_digest, "", store, progress, cancelled);
}

absl::StatusOr<Image> ImportArchive(const std::string& archive_path, const std::string& ref_name,
                                    LayerStore& store, const ProgressFn& progress,
                                    const CancelFn& cancelled) {
  UniqueFd in(::open(archive_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return ErrnoStatus(errno, fmt::format("image: open({})", archive_path));
  struct stat st {};
  ::fstat(in.get(), &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // Unpacked beside the archive (the same file system: the layers are read from there once).
  const size_t slash = archive_path.rfind('/');
  std::string tmpl =
      (slash == std::string::npos ? std::string(".") : archive_path.substr(0, slash)) +
      "/.import-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return ErrnoStatus(errno, fmt::format("image: mkdtemp({})", tmpl));
  }
  const std::string dir = tmpl;
  auto result = [&]() -> absl::StatusOr<Image> {
    UniqueFd base(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!base) return ErrnoStatus(errno, fmt::format("image: open({})", dir));
    archive::Extractor x(base.get(), dir, store.limits().max_archive_bytes);
    std::vector<char> buf(kChunk);
    uint64_t done = 0, next = 0;
    absl::Status read = x.Run([&]() -> absl::StatusOr<std::string_view> {
      if (cancelled && cancelled()) return absl::CancelledError("image import: cancelled");
      ssize_t n;
      do {
        n = ::read(in.get(), buf.data(), buf.size());
      } while (n < 0 && errno == EINTR);
      if (n < 0) return ErrnoStatus(errno, "image: read the archive");
      done += static_cast<uint64_t>(n);
      if (progress && done >= next) {
        next = done + (16 << 20);
        Progress p;
        p.stage = "reading";
        p.bytes_done = done;
        p.bytes_total = size;
        progress(p);
      }
      return std::string_view(buf.data(), static_cast<size_t>(n));
    });
    if (!read.ok()) return Annotate(read, "image archive");
    UniqueFd root(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root) return ErrnoStatus(errno, fmt::format("image: open({})", dir));
    if (::faccessat(root.get(), "index.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
      return ImportFromRoot(root.get(), "", ref_name, store, progress, cancelled);
    }
    if (::faccessat(root.get(), "manifest.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
      return ImportDockerArchive(root.get(), ref_name, store, progress, cancelled);
    }
    return absl::InvalidArgumentError(
        "image archive: neither an OCI layout (index.json) nor a docker archive (manifest.json)");
  }();
  if (absl::Status rm = RemoveTree(dir); !rm.ok() && result.ok()) return rm;
  return result;
}

}  // namespace sbx::image
