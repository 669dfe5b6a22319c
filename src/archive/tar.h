// A small tar (POSIX ustar + pax extended headers) writer and streaming reader, by hand: the
// agent is linked statically and must not pull in libarchive.
//
// Writer: regular files, directories and symlinks, with mode, uid, gid and mtime; names or link
// targets that do not fit ustar's fields, and sizes of 8 GiB or more, get a pax 'x' header
// (path, linkpath, size). Reader: a push parser over arbitrary chunks (the bytes arrive in
// frames from sbxd) that understands ustar, GNU-less POSIX tars and pax 'x'/'g' headers
// (path, linkpath, size, mtime); GNU long names ('L'/'K') are understood too since GNU tar
// emits them by default. Anything malformed is an InvalidArgument error; sizes and header
// counts are bounded so a hostile stream cannot make it allocate without limit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

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
inline constexpr size_t kMaxPaxHeaderBytes = 64 * 1024;

// The header block(s) for `e` (pax header first when needed). The caller appends e.size data
// bytes and then TarPadding(e.size).
absl::Status AppendTarHeader(std::string& out, const TarEntry& e);
std::string_view TarPadding(uint64_t size);
// Two zero blocks: the end of the archive.
std::string_view TarTrailer();

// Push parser. Callbacks: on_entry once per entry (after its headers), on_data with its data
// in order (possibly in several pieces), on_end_entry after the last byte. An error returned
// by a callback stops parsing and is returned by Feed.
class TarReader {
 public:
  std::function<absl::Status(const TarEntry&)> on_entry;
  std::function<absl::Status(std::string_view)> on_data;
  std::function<absl::Status()> on_end_entry;

  absl::Status Feed(std::string_view bytes);
  // Call at end of input: an error unless the archive ended properly (the zero blocks, or at
  // least a clean entry boundary: some writers omit the trailer).
  absl::Status Finish() const;
  bool done() const { return state_ == State::kDone; }

 private:
  enum class State { kHeader, kData, kPadding, kMeta, kDone };
  absl::Status OnHeader(const char* block);
  absl::Status ApplyPax(std::string_view records, bool global);

  State state_ = State::kHeader;
  std::string block_;        // partial header block
  uint64_t left_ = 0;        // data or meta bytes left in this entry
  size_t pad_left_ = 0;
  char meta_type_ = 0;       // 'x', 'g', 'L', 'K' while reading such a header's data
  std::string meta_;         // its data
  std::string pax_path_, pax_linkpath_;
  int64_t pax_size_ = -1, pax_mtime_ = INT64_MIN;
  std::string gnu_name_, gnu_link_;
  int zero_blocks_ = 0;
  bool in_file_ = false;     // on_entry called, on_end_entry not yet
};

}  // namespace sbx::archive
