// OCI images as sbxd's templates: the content-addressed layer store and the import of image
// archives and OCI layouts into it (docs/templates.md). Everything read here is untrusted: an
// archive, a manifest or a layer may lie about sizes and digests or try to write outside the
// store; each bad case is an error naming what was wrong, and nothing partial stays behind.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "image/progress.h"

namespace sbx::image {

// What an image's config says about running it (OCI image-spec config.config).
struct ImageConfig {
  std::vector<std::string> env;  // "K=V", in order
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::string working_dir;  // "" = "/"
  std::string user;         // "", "name", "uid", "name:group", "uid:gid"
  std::map<std::string, std::string> labels;
  std::string os;            // "linux"
  std::string architecture;  // "amd64"
};

// Bounds on what one import may write and on the whole store.
struct Limits {
  uint64_t max_image_bytes = 16ull << 30;   // unpacked bytes of one image's layers
  uint64_t max_store_bytes = 0;              // all layers; 0 = no bound but the disk
  uint64_t max_entries_per_layer = 1'000'000;
  uint64_t max_archive_bytes = 32ull << 30;  // an import's archive, as uploaded
  // Keep each layer's blob, as it was put (compressed or not), beside its tree: a cluster node
  // gives it to the nodes that lack the layer, which verify it against the diff_id as any
  // import does (docs/scale.md, "Templates"). Off on a single host: it doubles what a layer
  // takes on disk.
  bool keep_blobs = false;
};

struct LayerInfo {
  std::string diff_id;  // "sha256:<hex>" of the uncompressed tar
  uint64_t unpacked_bytes = 0;
  uint64_t entries = 0;
};

// An image in the store.
struct Image {
  std::string digest;         // "sha256:<hex>" of the manifest (the name a registry gives it)
  std::string config_digest;  // "sha256:<hex>" of the config blob
  std::vector<LayerInfo> layers;  // bottom first, as the manifest lists them
  ImageConfig config;
  nlohmann::json config_json;  // the config blob as read (for inspect)
};

// <root>/layers/sha256/<hex>: each layer unpacked once into a read-only tree (owned by root,
// OCI whiteouts turned into overlayfs ones), shared by every template that lists it. <root>
// is 0700: layers may hold setuid files. Safe to use from several threads: a layer being
// unpacked by one import is waited for by another that needs it.
class LayerStore {
 public:
  static absl::StatusOr<std::unique_ptr<LayerStore>> Open(const std::string& root, Limits limits);
  virtual ~LayerStore() = default;

  // The tree of a stored layer, for the runtime to stack as an overlay lower; NotFound if absent.
  virtual absl::StatusOr<std::string> TreeOf(const std::string& diff_id) const = 0;
  virtual bool Has(const std::string& diff_id) const = 0;
  // Unpacks the layer blob at `blob_path` (a tar, gzip- or zstd-compressed, as libarchive
  // detects) into the store unless that diff_id is there already, verifying the sha256 of the
  // uncompressed stream against `diff_id` (a mismatch is an error, and the tree is removed).
  // `max_bytes` bounds the unpacked bytes of this layer (the image's budget left); the result
  // counts them. Unpacks into a temporary directory of the store, then renames it into place.
  virtual absl::StatusOr<LayerInfo> Put(const std::string& blob_path, const std::string& diff_id,
                                        uint64_t max_bytes, const ProgressFn& progress,
                                        const CancelFn& cancelled) = 0;
  virtual std::vector<LayerInfo> List() const = 0;
  virtual uint64_t UsedBytes() const = 0;
  // The blob a layer was put from, kept when Limits::keep_blobs (<root>/blobs/<hex>); NotFound
  // when the layer is absent or was put before blobs were kept.
  virtual absl::StatusOr<std::string> BlobOf(const std::string& diff_id) const = 0;
  // Removes a layer no template lists any more (the caller's garbage collection decides).
  virtual absl::Status Remove(const std::string& diff_id) = 0;
  // Start-up: removes what a crash left half-unpacked.
  virtual absl::Status Sweep() = 0;
  virtual const Limits& limits() const = 0;
};

// Imports the image of an archive file: `docker save` / skopeo `docker-archive:` output, an
// `oci-archive:`, or an OCI layout packed as a tar. Layers already in the store are not
// unpacked again. `ref_name` picks one image of an archive that holds several (a RepoTag or an
// org.opencontainers.image.ref.name); "" takes the only one, or linux/amd64 from an index.
absl::StatusOr<Image> ImportArchive(const std::string& archive_path, const std::string& ref_name,
                                    LayerStore& store, const ProgressFn& progress,
                                    const CancelFn& cancelled);

// Imports the image of an OCI layout directory (oci-layout, index.json, blobs/sha256/…), as
// the registry client writes it. `manifest_digest` picks the manifest ("" as above).
absl::StatusOr<Image> ImportLayout(const std::string& layout_dir,
                                   const std::string& manifest_digest, LayerStore& store,
                                   const ProgressFn& progress, const CancelFn& cancelled);

}  // namespace sbx::image
