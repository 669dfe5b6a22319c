// A client of the OCI distribution API (Registry HTTP API v2) over libcurl: it fetches one
// image into an OCI layout directory, which image::ImportLayout then takes into the store.
// Credentials come from sbxd's configuration and never reach a sandbox.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "image/progress.h"

namespace sbx::registry {

// "registry.example:5000/team/app:1.2", "app@sha256:…", "127.0.0.1:5000/x" (tag latest).
// A first component without '.' or ':' (and not "localhost") is a Docker Hub repository.
struct Reference {
  std::string registry;    // "registry.example:5000"; "registry-1.docker.io" for Docker Hub
  std::string repository;  // "team/app"; "library/x" for an official Docker Hub image
  std::string tag;         // "" when digest is set
  std::string digest;      // "sha256:<hex>" or ""
  std::string String() const;
};
absl::StatusOr<Reference> ParseReference(const std::string& text);

struct RegistrySettings {
  std::string username, password;  // basic, or the credentials of the token flow; "" = anonymous
  // Plain http (a lab registry without TLS). https is always verified: a private CA goes in
  // ca_file; there is no switch that turns verification off.
  bool insecure = false;
  std::string ca_file;             // extra CA bundle to verify the registry's certificate
};

struct ClientOptions {
  std::map<std::string, RegistrySettings> registries;  // by Reference::registry
  std::string proxy;     // "http://proxy:3128"; "" = none (libcurl ignores *_proxy variables)
  std::string no_proxy;  // hosts that bypass it
  int parallel_layers = 3;
  int retries = 3;  // per blob, resuming with Range from the bytes already written
  uint64_t max_manifest_bytes = 4 << 20;
  uint64_t max_blob_bytes = 16ull << 30;
};

// Fetches `ref` into `layout_dir` (made if missing): an index or manifest list picks
// linux/amd64. Every blob's digest and size are verified; blobs already there and verified are
// kept, partial ones are resumed. Returns the digest of the image manifest written to the
// layout's index.json. When `have` says yes to the image manifest's digest, nothing more is
// fetched and the digest is returned with the layout left incomplete: the caller already
// holds that image (a build's FROM of an image it pulled before).
absl::StatusOr<std::string> PullToLayout(
    const Reference& ref, const ClientOptions& options, const std::string& layout_dir,
    const image::ProgressFn& progress, const image::CancelFn& cancelled,
    const std::function<bool(const std::string& digest)>& have = nullptr);

}  // namespace sbx::registry
