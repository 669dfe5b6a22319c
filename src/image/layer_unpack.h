// One OCI layer blob unpacked into a directory of the layer store (layer_store.cc), as the
// overlay's lower it will be. The blob is untrusted: see UnpackLayer.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "image/progress.h"

namespace sbx::image {

struct UnpackLimits {
  uint64_t max_bytes = 0;    // declared sizes of the regular files, in all
  uint64_t max_entries = 0;  // entries of the tar, whiteouts included
};

struct UnpackResult {
  uint64_t unpacked_bytes = 0;
  uint64_t entries = 0;
  uint64_t skipped = 0;  // device nodes (a sandbox has its own /dev)
  std::string diff_id;   // "sha256:<hex>" of the uncompressed stream
};

// Reads the blob at `blob_path` (a tar, plain, gzip or zstd: libarchive's filters decide) and
// writes its entries under `dest`, an empty directory, while hashing the uncompressed stream:
// a diff_id other than `expected_diff_id` is an error (DataLoss). Every entry is created
// relative to `dest` resolved in it as the root (openat2 RESOLVE_IN_ROOT): `..` above the root
// is refused, absolute names are taken relative to it, symlinks the layer plants are never
// followed out of it, a hard link must name an entry inside it. Owners, modes (setuid kept:
// the store is 0700 and the runtime mounts layers nosuid), mtimes and user.* xattrs are kept;
// trusted.* and security.* xattrs are dropped (an image must not set overlayfs' own
// attributes, nor file capabilities sbxd never grants). OCI whiteouts become overlayfs ones: a
// `.wh.NAME` file a 0/0 character device NAME, `.wh..wh..opq` the opaque xattr
// (trusted.overlay.opaque and user.overlay.opaque) on its directory. Bounds: `limits`, names
// of at most 255 bytes, paths of at most 4096 and 512 components; the uncompressed stream
// may not exceed what those allow (a decompression bomb stops early). On error `dest` holds a
// partial tree: the caller removes it.
absl::StatusOr<UnpackResult> UnpackLayer(const std::string& blob_path, const std::string& dest,
                                         const std::string& expected_diff_id,
                                         const UnpackLimits& limits, const ProgressFn& progress,
                                         const CancelFn& cancelled);

// Removes a tree through fds, depth first with an explicit stack (no recursion: a layer may
// nest 512 deep), never following a symlink.
absl::Status RemoveTree(const std::string& path);

// "sha256:<64 lowercase hex>"
bool IsDigest(const std::string& d);

}  // namespace sbx::image
