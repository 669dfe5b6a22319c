// A template build's RUN step keeps what its command changed (docs/templates.md, "Builds"):
// the overlay's upper directory, turned into an OCI layer tar. Overlayfs and OCI describe a
// change the same way but spell it differently: a deleted file is a 0/0 character device in
// the upper and a `.wh.NAME` file in a layer; a directory that hides the one below carries
// trusted.overlay.opaque=y in the upper and a `.wh..wh..opq` entry in a layer. Owners are host
// uids of the sandbox's range in the upper and the sandbox's own uids in a layer.
//
// The upper was written by untrusted code. The walk never follows a symlink (openat with
// O_NOFOLLOW from the directory fd it came from), reads only regular files, and is bounded in
// depth; the tar it writes is unpacked by the layer store's contained unpacker like any other
// layer, so nothing here decides what may land in the store.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

inline constexpr int kMaxUpperDepth = 512;

struct UpperLayer {
  std::string diff_id;     // "sha256:<hex>" of the tar written
  uint64_t tar_bytes = 0;
  uint64_t entries = 0;
};

// Writes the tree of `upper_fd` (a directory fd) to `out_fd` as a tar: entries sorted by name
// (the same changes give the same diff_id), directories before their contents, hard links
// kept, whiteouts and opaque directories in OCI form, uids and gids in [uid_base,
// uid_base + 65536) shifted down by uid_base and any other owner written as 0. Sockets and
// devices other than whiteouts are left out. `cancelled` is asked between entries. More than
// `max_entries` entries is ResourceExhausted (the tar would cost 512 bytes of header each).
absl::StatusOr<UpperLayer> WriteUpperAsLayer(int upper_fd, uint32_t uid_base, int out_fd,
                                             const std::function<bool()>& cancelled = {},
                                             uint64_t max_entries = UINT64_MAX);

}  // namespace sbx::runtime::ns
