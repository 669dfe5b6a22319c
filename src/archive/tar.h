// src/archive: the project's one archive implementation, shared by the agent (PUT and GET of
// a directory as tar), the CLI (`sbx cp` of a directory) and, with the templates issue, sbxd
// (OCI layers). Decision (issue 14, item 6): libarchive (Debian's libarchive-dev 3.6.2) reads
// every archive; the containment on the file-system side is ours (untar.h); the one writer,
// which formats only our own directories, stays a small ustar+pax formatter here (below).
//
// Why, and what links (Debian 12, x86_64, gcc 12; sizes after `strip`):
// - Reading is where the untrusted bytes are (a client's upload, a sandbox's download, an OCI
//   layer): a maintained, widely fuzzed parser that knows pax, GNU long names and sparse
//   files, v7, and (for sbxd, later) gzip/zstd/xz, rather than growing our own.
// - The agent is linked statically. libarchive's tar reader links from libarchive.a alone with
//   nothing but libc: +140 KiB over an empty static program (822 KiB vs 683 KiB); sbx-agent
//   grows from 3,281,208 to 3,408,248 bytes (+124 KiB, 3.9%). libarchive's own dependencies
//   (acl, xml2, nettle, zstd, lz4, lzma, bz2, z) are only referenced by formats and filters
//   the agent does not enable.
// - libarchive's tar writer cannot be linked alone: every tar writer refers to
//   __archive_write_entry_filetype_unsupported, whose object also holds the table of all
//   write formats, which pulls xar (libxml2, and through it ICU's 30 MB of data), 7zip, zip
//   (nettle), iso9660 and mtree: a static probe grew from 0.7 MB to 34.9 MB. Only a stub of
//   that private symbol would avoid it. So the writer stays ours (~100 lines, never fed
//   untrusted bytes); the tests read its archives back with libarchive and with GNU tar.
// - Character sets: libarchive converts pax's UTF-8 names to the locale's charset with iconv.
//   In the static agent (PID 1 of a sandbox, whose root is the sandbox's file system) glibc's
//   iconv_open would read gconv-modules from the sandbox's /usr/lib and may dlopen a module
//   from there, so the agent links with --wrap=iconv_open and refuses every conversion
//   (no_iconv.cc): libarchive then keeps a name's bytes as they are (a warning, not an error),
//   which is what a file system wants. The CLI and sbxd use the host's iconv.
// - Reading pulls: libarchive asks for bytes (ByteSource) instead of being fed them, so the
//   agent's frame loop and the CLI's HTTP body are sources. Memory stays bounded by
//   libarchive's read-ahead of one header and one piece: it refuses a pax or GNU extended
//   header over 1 MiB (the hand-written reader refused them over 64 KiB), and names over
//   kMaxTarNameBytes are refused here.
// - Where libarchive differs from the hand-written reader: a single zero block ends the
//   archive (it was an error if more followed), and an unknown entry type is a regular file,
//   as POSIX says (it was skipped).
//
// The writer: regular files, directories and symlinks, with mode, uid, gid and mtime; names or
// link targets that do not fit ustar's fields, and sizes of 8 GiB or more, get a pax 'x' header
// (path, linkpath, size).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::archive {

enum class TarType : char {
  kFile = '0',
  kHardLink = '1',
  kSymlink = '2',
  kCharDev = '3',
  kBlockDev = '4',
  kDirectory = '5',
  kFifo = '6',
  kOther = '?',
};

struct TarEntry {
  std::string name;      // as stored (a directory's trailing '/' removed)
  TarType type = TarType::kFile;
  uint32_t mode = 0644;  // permission bits
  uint32_t uid = 0, gid = 0;
  int64_t mtime = 0;     // seconds since the epoch
  uint64_t size = 0;     // data bytes (regular files only)
  std::string linkname;  // symlink target or hard-link source
};

inline constexpr size_t kTarBlock = 512;
inline constexpr size_t kMaxTarNameBytes = 4096;

// The header block(s) for `e` (pax header first when needed). The caller appends e.size data
// bytes and then TarPadding(e.size).
absl::Status AppendTarHeader(std::string& out, const TarEntry& e);
std::string_view TarPadding(uint64_t size);
// Two zero blocks: the end of the archive.
std::string_view TarTrailer();

// Where an archive's bytes come from: each call returns the next piece of the input (valid
// until the next call), an empty piece at its end. An error of the source ends the reading and
// is returned as it is.
using ByteSource = std::function<absl::StatusOr<std::string_view>()>;

// A streaming tar reader over libarchive (tar format only, no filters): it pulls pieces from
// the source as it needs them and never holds an entry's data, only libarchive's read-ahead of
// a header. It understands ustar, pax ('x'/'g'), GNU (long names, sparse files) and old v7
// tars. Anything malformed is an InvalidArgument error "tar: <libarchive's reason>"; names and
// link targets over kMaxTarNameBytes are refused.
class TarReader {
 public:
  explicit TarReader(ByteSource source);
  ~TarReader();
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next entry, nullopt at the end of the archive (its zero blocks, or the end of the input
  // at an entry boundary: some writers omit the trailer).
  absl::StatusOr<std::optional<TarEntry>> Next();

  // The next piece of the current entry's data, to be written at `offset` (a sparse entry's
  // pieces skip its holes); an empty piece at the end of the entry. Only regular files have
  // data.
  struct Piece {
    uint64_t offset = 0;
    std::string_view bytes;
  };
  absl::StatusOr<Piece> Read();

  // After the end of the archive: reads what is left of the input (the zero padding some
  // writers add up to a record size), so that a sender is never cut off mid-stream.
  absl::Status Drain();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx::archive
