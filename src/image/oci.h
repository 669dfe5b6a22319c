// Parsers of the OCI image-spec and Docker documents an import or a pull reads: indexes and
// manifest lists, manifests, image configs, and a `docker save` manifest.json. All input is
// untrusted: each parser takes the text (at most kMaxDocumentBytes), never throws, checks every
// type, digest and size, and names what is wrong. No file I/O here (tests/fuzz/oci_parsers_fuzz.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "image/image.h"

namespace sbx::image::oci {

inline constexpr size_t kMaxDocumentBytes = 4 << 20;
inline constexpr size_t kMaxLayers = 256;

inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kDockerList =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kDockerManifest =
    "application/vnd.docker.distribution.manifest.v2+json";

struct Descriptor {
  std::string media_type;
  std::string digest;  // "sha256:<hex>"
  uint64_t size = 0;
  std::string os, architecture, variant;  // platform, for an index's entries
  std::string ref_name;                   // org.opencontainers.image.ref.name
  bool IsIndex() const { return media_type == kOciIndex || media_type == kDockerList; }
};

struct Index {
  std::vector<Descriptor> manifests;
};

struct Manifest {
  std::string media_type;
  Descriptor config;
  std::vector<Descriptor> layers;  // bottom first
};

struct Config {
  ImageConfig config;
  std::vector<std::string> diff_ids;  // bottom first
};

// One image of a `docker save` archive.
struct DockerImage {
  std::string config;                  // path in the archive
  std::vector<std::string> repo_tags;  // "name:tag"
  std::vector<std::string> layers;     // paths in the archive, bottom first
};

absl::StatusOr<Index> ParseIndex(std::string_view text);
absl::StatusOr<Manifest> ParseManifest(std::string_view text);
absl::StatusOr<Config> ParseConfig(std::string_view text);
absl::StatusOr<std::vector<DockerImage>> ParseDockerManifest(std::string_view text);

// The entry of an index to import: the one whose ref.name is `ref_name` when given; else the
// only entry, or the linux/amd64 one.
absl::StatusOr<Descriptor> Choose(const Index& index, const std::string& ref_name);

// Whether a layer's media type is one sbxd unpacks (tar, gzip or zstd; OCI or Docker).
bool IsLayerType(std::string_view media_type);

// The config as stored with a template (the API shows it).
nlohmann::json ConfigJson(const ImageConfig& c);

}  // namespace sbx::image::oci
