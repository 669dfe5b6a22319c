// COPY and ADD of a template build (docs/templates.md, "Builds"): the entries of the uploaded
// build context (a tar the client sent, untrusted) that a step names, renamed to where the step
// puts them, as a new tar that the build sandbox's agent unpacks at "/" with its contained
// extractor. Docker's rules: a directory source copies its contents, not itself; a file source
// lands at DEST, or inside it when DEST ends in '/' or there are several sources; `*`, `?` and
// `[…]` match within one path component; DEST's missing parents are made by the extractor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "image/progress.h"

namespace sbx::image {

struct CopySpec {
  std::vector<std::string> sources;  // relative to the context root, expanded
  std::string dest;                  // absolute, expanded ("/app", "/app/")
  std::optional<uint32_t> chmod;     // --chmod for every file and directory copied
};

struct CopyResult {
  std::string digest;  // "sha256:<hex>" of the tar written (the step's cache key takes it)
  uint64_t entries = 0;
  uint64_t bytes = 0;
};

// Reads the context tar at `context_path` once and writes the selected entries to `out_fd`.
// InvalidArgument when a source matches nothing ("COPY: \"x\" is not in the build context") or
// the context is not a tar; entries with `..` or absolute names are never selected.
absl::StatusOr<CopyResult> WriteCopyTar(const std::string& context_path, const CopySpec& spec,
                                        int out_fd, const CancelFn& cancelled);

// The normalized relative form of a context path ("./a//b/" -> "a/b", "." and "/" -> "");
// nullopt when it climbs out ("..").
std::optional<std::string> NormalizeContextPath(std::string_view p);

}  // namespace sbx::image
