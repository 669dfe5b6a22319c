// COPY and ADD of a template build (docs/templates.md, "Builds"): the entries of the uploaded
// build context (a tar the client sent, untrusted) that a step names, renamed to where the step
// puts them, as a new tar that the build sandbox's agent unpacks at "/" with its contained
// extractor. Docker's rules: a directory source copies its contents, not itself; a file source
// lands at DEST, or inside it when DEST ends in '/' or there are several sources; `*`, `?` and
// `[…]` match within one path component; DEST's missing parents are made by the extractor.
//
// ADD (unpack_archives) also unpacks a source that is itself a regular file holding a tar
// archive, as is or compressed once with gzip, bzip2, xz or zstd: its entries go under DEST
// (a directory, whatever its form; the archive's own name is not used), renamed, owned by root
// and --chmod'ed as copies are. As Docker's detector decides, a file is an archive when,
// decompressed according to its magic bytes, its first tar header reads; any other file
// (a gzip of a non-tar, a .tar.gz.gz, garbage after gzip magic) is copied as COPY copies it.
// An archive malformed after its first entry, or with an entry that is absolute or climbs out
// with `..`, fails the step; devices and FIFOs in it are left out, an archive in the archive
// is not unpacked again, and files under a directory source are never unpacked (Docker's rule
// too). The source is spooled to an unlinked file beside the context while it is inspected, so
// the context is still read once. max_bytes bounds the data written (holes of sparse files
// count, and an archive's headers too): the context is small on the wire, but a sparse file or
// a compressed archive in it must not fill sbxd's disk.
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
  bool unpack_archives = false;      // ADD: a source file that is a tar archive is unpacked
  // The data bytes the output may hold (ResourceExhausted past it, "the template's
  // max_unpacked_bytes"): files' sizes, holes included, and an unpacked archive's headers.
  uint64_t max_bytes = UINT64_MAX;
};

struct CopyResult {
  std::string digest;  // "sha256:<hex>" of the tar written (the step's cache key takes it)
  uint64_t entries = 0;  // entries written, an unpacked archive's included
  uint64_t bytes = 0;    // the tar's size
};

// Reads the context tar at `context_path` once and writes the selected entries to `out_fd`.
// InvalidArgument when a source matches nothing ("COPY: \"x\" is not in the build context") or
// the context is not a tar; entries with `..` or absolute names are never selected.
// ADD of a malformed archive: InvalidArgument "ADD: \"x.tar.gz\": <reason>".
absl::StatusOr<CopyResult> WriteCopyTar(const std::string& context_path, const CopySpec& spec,
                                        int out_fd, const CancelFn& cancelled);

// The normalized relative form of a context path ("./a//b/" -> "a/b", "." and "/" -> "");
// nullopt when it climbs out ("..").
std::optional<std::string> NormalizeContextPath(std::string_view p);

}  // namespace sbx::image
