// LayerTarFile and WriteUpperAsLayerFile: sbxd's side of a build layer. Apart from
// upper_layer.cc because they hash (OpenSSL), and the static agent links upper_layer.o alone.
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "archive/upper_layer.h"
#include "common/digest.h"
#include "common/status_util.h"

namespace sbx::archive {

LayerTarFile::LayerTarFile(int out_fd, uint64_t max_bytes)
    : out_(out_fd), max_bytes_(max_bytes), hash_(std::make_unique<Sha256Stream>()) {}

LayerTarFile::~LayerTarFile() = default;

absl::Status LayerTarFile::Write(std::string_view piece) {
  if (piece.size() > max_bytes_ - written_) {
    return absl::ResourceExhaustedError(
        fmt::format("build layer: the layer tar is larger than {} bytes", max_bytes_));
  }
  hash_->Update(piece.data(), piece.size());
  while (!piece.empty()) {
    ssize_t w = ::write(out_, piece.data(), piece.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoStatus(errno, "build layer: write the layer tar");
    piece.remove_prefix(static_cast<size_t>(w));
    written_ += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

std::string LayerTarFile::Digest() { return hash_->Digest(); }

absl::StatusOr<UpperLayer> WriteUpperAsLayerFile(int upper_fd, uint32_t uid_base,
                                                 uint32_t uid_range, int out_fd,
                                                 const std::function<bool()>& cancelled,
                                                 uint64_t max_entries) {
  LayerTarFile file(out_fd);
  TarSink sink = [&](std::string_view piece) { return file.Write(piece); };
  SBX_ASSIGN_OR_RETURN(UpperWalk walk,
                       WriteUpperAsLayer(upper_fd, uid_base, uid_range, sink, cancelled, max_entries));
  return UpperLayer{file.Digest(), walk.tar_bytes, walk.entries};
}

}  // namespace sbx::archive
