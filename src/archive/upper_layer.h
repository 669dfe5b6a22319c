// A template build's RUN step keeps what its command changed (docs/templates.md, "Builds"):
// the overlay's upper directory, turned into an OCI layer tar. Overlayfs and OCI describe a
// change the same way but spell it differently: a deleted file is a 0/0 character device in
// the upper and a `.wh.NAME` file in a layer; a directory that hides the one below carries
// trusted.overlay.opaque=y in the upper and a `.wh..wh..opq` entry in a layer. Owners are host
// uids of the sandbox's range in the upper (ns) and the sandbox's own uids in a layer.
//
// Two writers use it: sbxd, over an ns sandbox's upper on the host (WriteUpperAsLayerFile),
// and sbx-agent inside a microVM guest, whose upper only the guest's kernel can read (it
// streams the tar to the host as kData frames; the host hashes what arrives). The archive code
// is linked into the static agent, so the walk itself hashes nothing (no OpenSSL there).
//
// The upper was written by untrusted code. The walk never follows a symlink (openat with
// O_NOFOLLOW from the directory fd it came from), reads only regular files, and is bounded in
// depth; the tar it writes is unpacked by the layer store's contained unpacker like any other
// layer, so nothing here decides what may land in the store.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx {
class Sha256Stream;  // common/digest.h
}

namespace sbx::archive {

inline constexpr int kMaxUpperDepth = 512;

// Receives the tar in order, in pieces of about 1 MiB; an error ends the walk with it.
using TarSink = std::function<absl::Status(std::string_view)>;

struct UpperWalk {
  uint64_t tar_bytes = 0;
  uint64_t entries = 0;
};

// Writes the tree of `upper_fd` (a directory fd) to `sink` as a tar: entries sorted by name
// (the same changes give the same diff_id), directories before their contents, hard links
// kept, whiteouts and opaque directories in OCI form, uids and gids in [uid_base,
// uid_base + uid_range) shifted down by uid_base and any other owner written as 0 (uid_base 0:
// owners as they are). Sockets and devices other than whiteouts are left out. `cancelled` is
// asked between entries. More than `max_entries` entries is ResourceExhausted (the tar would
// cost 512 bytes of header each).
absl::StatusOr<UpperWalk> WriteUpperAsLayer(int upper_fd, uint32_t uid_base, uint32_t uid_range,
                                            const TarSink& sink,
                                            const std::function<bool()>& cancelled = {},
                                            uint64_t max_entries = UINT64_MAX);

// What a layer tar file holds, as the build records it.
struct UpperLayer {
  std::string diff_id;  // "sha256:<hex>" of the tar written
  uint64_t tar_bytes = 0;
  uint64_t entries = 0;
};

// Writes pieces of a tar to an fd, hashing them; `max_bytes` more is ResourceExhausted (a
// guest's stream is bounded by the host, not by the guest).
class LayerTarFile {
 public:
  LayerTarFile(int out_fd, uint64_t max_bytes = UINT64_MAX);
  ~LayerTarFile();
  LayerTarFile(const LayerTarFile&) = delete;
  LayerTarFile& operator=(const LayerTarFile&) = delete;
  absl::Status Write(std::string_view piece);
  uint64_t bytes() const { return written_; }
  // "sha256:<hex>" of everything written; the file is spent.
  std::string Digest();

 private:
  const int out_;
  const uint64_t max_bytes_;
  uint64_t written_ = 0;
  std::unique_ptr<Sha256Stream> hash_;
};

// WriteUpperAsLayer into an fd, hashed (layer_tar_file.cc, apart: the agent never links it): an ns sandbox's upper on the host.
absl::StatusOr<UpperLayer> WriteUpperAsLayerFile(int upper_fd, uint32_t uid_base,
                                                 uint32_t uid_range, int out_fd,
                                                 const std::function<bool()>& cancelled = {},
                                                 uint64_t max_entries = UINT64_MAX);

}  // namespace sbx::archive
