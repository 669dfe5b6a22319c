#include "image/build_context.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "archive/tar.h"
#include "common/digest.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace sbx::image {
namespace {

using archive::TarEntry;
using archive::TarType;

constexpr size_t kFlushBytes = 1 << 20;
constexpr size_t kReadBytes = 1 << 20;
// The spooled archive's reads: its decompressor's output blocks are 64 KiB anyway.
constexpr size_t kSpoolReadBytes = 64 << 10;

bool HasGlob(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

size_t Components(std::string_view s) {
  if (s.empty()) return 0;
  size_t n = 1;
  for (char c : s) n += c == '/';
  return n;
}

// The first `k` components of `n`, or nullopt when it has fewer.
std::optional<std::string> Prefix(const std::string& n, size_t k) {
  size_t pos = 0;
  for (size_t i = 0; i < k; ++i) {
    if (pos > n.size()) return std::nullopt;
    size_t slash = n.find('/', pos);
    if (slash == std::string::npos) {
      if (i + 1 < k) return std::nullopt;
      return n;
    }
    pos = slash + 1;
  }
  return n.substr(0, pos - 1);
}

std::string Base(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Join(const std::string& dir, const std::string& rest) {
  if (rest.empty()) return dir;
  if (dir.empty()) return rest;
  return dir + "/" + rest;
}

class Out {
 public:
  explicit Out(int fd) : fd_(fd) {}
  std::string& buf() { return buf_; }
  absl::Status Maybe() { return buf_.size() >= kFlushBytes ? Flush() : absl::OkStatus(); }
  absl::Status Flush() {
    hash_.Update(buf_.data(), buf_.size());
    std::string_view rest = buf_;
    while (!rest.empty()) {
      ssize_t w = ::write(fd_, rest.data(), rest.size());
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoStatus(errno, "build COPY: write the step's tar");
      rest.remove_prefix(static_cast<size_t>(w));
    }
    bytes_ += buf_.size();
    buf_.clear();
    return absl::OkStatus();
  }
  // A sparse entry's hole: a piece at a time, so that a hole of gigabytes never sits in memory.
  absl::Status Zeros(uint64_t n) {
    while (n > 0) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, kFlushBytes));
      buf_.append(k, '\0');
      n -= k;
      SBX_RETURN_IF_ERROR(Maybe());
    }
    return absl::OkStatus();
  }
  std::string Digest() { return hash_.Digest(); }
  uint64_t bytes() const { return bytes_; }

 private:
  int fd_;
  std::string buf_;
  Sha256Stream hash_;
  uint64_t bytes_ = 0;
};

// The normalized name of a context entry (or a hard link's target): nullopt for one that climbs
// out or is absolute, which is never selected.
std::optional<std::string> ContextName(std::string_view n) {
  if (!n.empty() && n.front() == '/') return std::nullopt;
  return NormalizeContextPath(n);
}

// The reader's error: a malformed context is the client's (InvalidArgument), while the
// source's own errors (Cancelled, a failed read) stay what they are.
absl::Status ContextError(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument) return s;
  return absl::InvalidArgumentError(fmt::format("build context: {}", std::string(s.message())));
}

// An archive's error, named after the ADD source it is in; Cancelled and the host's own errors
// stay what they are.
absl::Status ArchiveError(const std::string& src, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument) return s;
  return absl::InvalidArgumentError(
      fmt::format("ADD: \"{:.100}\": {}", src, std::string(s.message())));
}

// The current entry's data, each piece given to `put` (none: read past). What follows a header
// in the output must be exactly e.size bytes, or the rest would read as entries of the image,
// so a sparse map that places data past the size, or goes back, is refused.
using PutFn = std::function<absl::Status(uint64_t offset, std::string_view bytes)>;
absl::Status ReadData(archive::TarReader& reader, const TarEntry& e, const std::string& name,
                      const PutFn& put) {
  uint64_t written = 0;
  for (;;) {
    SBX_ASSIGN_OR_RETURN(archive::TarReader::Piece piece, reader.Read());
    if (piece.bytes.empty()) return absl::OkStatus();
    if (!put) continue;
    if (piece.offset < written || piece.offset > e.size ||
        piece.bytes.size() > e.size - piece.offset) {
      return absl::InvalidArgumentError(
          fmt::format("\"{:.100}\": data beyond the entry's size", name));
    }
    SBX_RETURN_IF_ERROR(put(piece.offset, piece.bytes));
    written = piece.offset + piece.bytes.size();
  }
}

// A regular file's data into the output: its pieces, its holes as zeros, its padding.
absl::Status WriteFileData(archive::TarReader& reader, const TarEntry& e,
                           const std::string& name, Out& out) {
  uint64_t written = 0;
  SBX_RETURN_IF_ERROR(ReadData(reader, e, name, [&](uint64_t offset, std::string_view bytes) {
    SBX_RETURN_IF_ERROR(out.Zeros(offset - written));
    out.buf().append(bytes);
    written = offset + bytes.size();
    return out.Maybe();
  }));
  SBX_RETURN_IF_ERROR(out.Zeros(e.size - written));
  out.buf().append(archive::TarPadding(e.size));
  return out.Maybe();
}

// The data bytes written (holes included): a context is small on the wire but may hold a
// sparse file or a compressed archive that would fill sbxd's disk.
class Budget {
 public:
  Budget(uint64_t max, std::string step) : max_(max), step_(std::move(step)) {}
  absl::Status Take(uint64_t n, const std::string& what) {
    if (n > max_ - used_) {
      return absl::ResourceExhaustedError(fmt::format(
          "{}: {} takes the step over {} bytes of data, the template's max_unpacked_bytes",
          step_, what, max_));
    }
    used_ += n;
    return absl::OkStatus();
  }

 private:
  uint64_t max_;
  std::string step_;
  uint64_t used_ = 0;
};

// Where an ADD source file waits while it is read as an archive: one unlinked file in the
// context's directory (sbxd's private build directory), emptied for each source.
class Spool {
 public:
  explicit Spool(const std::string& context_path) {
    const size_t slash = context_path.rfind('/');
    dir_ = slash == std::string::npos ? "." : slash == 0 ? "/" : context_path.substr(0, slash);
  }
  absl::StatusOr<int> Empty() {
    if (fd_) {
      if (::ftruncate(fd_.get(), 0) != 0) return ErrnoStatus(errno, "build ADD: ftruncate(spool)");
      return fd_.get();
    }
    fd_.Reset(::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!fd_ && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
      // A file system without O_TMPFILE: a named file, unlinked at once.
      std::string t = dir_ + "/.add-spool-XXXXXX";
      fd_.Reset(::mkostemp(t.data(), O_CLOEXEC));
      if (fd_ && ::unlink(t.c_str()) != 0) {
        const int err = errno;
        fd_.Reset();
        return ErrnoStatus(err, fmt::format("build ADD: unlink({})", t));
      }
    }
    if (!fd_) return ErrnoStatus(errno, fmt::format("build ADD: open a spool file in {}", dir_));
    return fd_.get();
  }

 private:
  std::string dir_;
  UniqueFd fd_;
};

absl::Status PWriteAll(int fd, std::string_view bytes, uint64_t offset) {
  while (!bytes.empty()) {
    const ssize_t w = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoStatus(errno, "build ADD: pwrite(spool)");
    bytes.remove_prefix(static_cast<size_t>(w));
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

struct ArchiveFree {
  void operator()(::archive* a) const { archive_read_free(a); }
};
using ArchivePtr = std::unique_ptr<::archive, ArchiveFree>;

// The output: kept entries renamed, owned by root, --chmod applied, and counted.
class Writer {
 public:
  Writer(const CopySpec& spec, int out_fd, const CancelFn& cancelled)
      : spec_(spec),
        out_(out_fd),
        budget_(spec.max_bytes, spec.unpack_archives ? "ADD" : "COPY"),
        cancelled_(cancelled) {}

  Out& out() { return out_; }
  CopyResult& result() { return result_; }

  // The header of `e` (already renamed), its data taken from the budget, and with
  // `charge_header` its header too: an archive's entries are not bounded by the context's size,
  // and a compressed stream of millions of headers would fill the disk as well as one of data.
  absl::Status Header(TarEntry& e, bool charge_header, const std::string& what) {
    e.uid = e.gid = 0;
    if (spec_.chmod && e.type != TarType::kSymlink) e.mode = *spec_.chmod;
    if (e.type != TarType::kFile) e.size = 0;
    std::string h;
    SBX_RETURN_IF_ERROR(archive::AppendTarHeader(h, e));
    SBX_RETURN_IF_ERROR(budget_.Take((charge_header ? h.size() : 0) + e.size, what));
    out_.buf().append(h);
    ++result_.entries;
    return out_.Maybe();
  }

  // The spooled file's `size` bytes (and padding) after its header.
  absl::Status CopySpool(int fd, uint64_t size) {
    uint64_t off = 0;
    std::string& buf = out_.buf();
    while (off < size) {
      if (cancelled_ && cancelled_()) return absl::CancelledError("build ADD: cancelled");
      const size_t want = static_cast<size_t>(std::min<uint64_t>(size - off, kReadBytes));
      const size_t old = buf.size();
      buf.resize(old + want);
      const ssize_t n = ::pread(fd, buf.data() + old, want, static_cast<off_t>(off));
      buf.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "build ADD: pread(spool)");
      if (n == 0) return absl::InternalError("build ADD: the spool file is shorter than written");
      off += static_cast<uint64_t>(n);
      SBX_RETURN_IF_ERROR(out_.Maybe());
    }
    out_.buf().append(archive::TarPadding(size));
    return out_.Maybe();
  }

  // The spooled file `src` unpacked into `dest` when it is a tar archive, as is or compressed
  // once with gzip, bzip2, xz or zstd: false (nothing written) when it is not one. As Docker's
  // detector: a file counts as an archive when, decompressed by its magic bytes, its first tar
  // header reads; an error after that is the archive's.
  absl::StatusOr<bool> Unpack(int fd, const std::string& src, const std::string& dest) {
    if (::lseek(fd, 0, SEEK_SET) != 0) return ErrnoStatus(errno, "build ADD: lseek(spool)");
    ArchivePtr outer(archive_read_new());
    if (!outer) return absl::ResourceExhaustedError("build ADD: archive_read_new failed");
    ::archive* a = outer.get();
    // Only the compressions Docker knows; ARCHIVE_WARN would mean an external program.
    if (archive_read_support_format_raw(a) != ARCHIVE_OK ||
        archive_read_support_filter_gzip(a) != ARCHIVE_OK ||
        archive_read_support_filter_bzip2(a) != ARCHIVE_OK ||
        archive_read_support_filter_xz(a) != ARCHIVE_OK ||
        archive_read_support_filter_zstd(a) != ARCHIVE_OK) {
      const char* why = archive_error_string(a);
      return absl::InternalError(fmt::format("build ADD: libarchive's decompressors: {}",
                                             why != nullptr ? why : "not built in"));
    }
    if (archive_read_open_fd(a, fd, kSpoolReadBytes) != ARCHIVE_OK) return false;
    ::archive_entry* raw = nullptr;
    if (archive_read_next_header(a, &raw) != ARCHIVE_OK) return false;
    // Docker decompresses once: a .tar.gz.gz is a file (the client's "none" is the first).
    if (archive_filter_count(a) > 2) return false;
    // A block at a time, as the decompressor makes them: archive_read_data into a larger
    // buffer would lose the blocks before an error (a cut stream would then not be an archive).
    archive::TarReader inner([&]() -> absl::StatusOr<std::string_view> {
      if (cancelled_ && cancelled_()) return absl::CancelledError("build ADD: cancelled");
      for (;;) {
        const void* block = nullptr;
        size_t size = 0;
        la_int64_t offset = 0;
        const int r = archive_read_data_block(a, &block, &size, &offset);
        if (r == ARCHIVE_EOF) return std::string_view();
        if (r < ARCHIVE_WARN) {
          const char* why = archive_error_string(a);
          return absl::InvalidArgumentError(
              fmt::format("decompress: {}", why != nullptr ? why : "read error"));
        }
        if (size > 0) return std::string_view(static_cast<const char*>(block), size);
      }
    });
    auto next = inner.Next();
    if (!next.ok() && absl::IsCancelled(next.status())) return next.status();
    if (!next.ok() || !next->has_value()) return false;
    std::map<std::string, std::string> renamed;  // name in the archive -> output name
    for (;;) {
      TarEntry e = **next;
      auto name = ContextName(e.name);
      if (!name) {
        return absl::InvalidArgumentError(fmt::format(
            "ADD: \"{:.100}\": the entry \"{:.100}\" is absolute or climbs out with ..", src,
            e.name));
      }
      const std::string target = Join(dest, *name);
      // The archive's own root ("./") is DEST, which Docker makes and leaves as it is.
      bool keep = !name->empty() && !target.empty() &&
                  (e.type == TarType::kFile || e.type == TarType::kDirectory ||
                   e.type == TarType::kSymlink || e.type == TarType::kHardLink);
      if (keep && e.type == TarType::kHardLink) {
        auto link = ContextName(e.linkname);
        if (!link) {
          return absl::InvalidArgumentError(fmt::format(
              "ADD: \"{:.100}\": the hard link \"{:.100}\" points at \"{:.100}\", which is "
              "absolute or climbs out with ..",
              src, e.name, e.linkname));
        }
        auto it = renamed.find(*link);
        if (it == renamed.end()) {
          keep = false;  // its target is not in the output: nothing to point at
        } else {
          e.linkname = it->second;
        }
      }
      if (keep) {
        const std::string what = fmt::format("\"{:.100}\" of \"{:.100}\"", *name, src);
        renamed[*name] = target;
        e.name = target;
        const absl::Status header = Header(e, /*charge_header=*/true, what);
        if (!header.ok()) return ArchiveError(src, header);
      }
      const absl::Status data = keep && e.type == TarType::kFile
                                    ? WriteFileData(inner, e, *name, out_)
                                    : ReadData(inner, e, *name, nullptr);
      if (!data.ok()) return ArchiveError(src, data);
      if (cancelled_ && cancelled_()) return absl::CancelledError("build ADD: cancelled");
      next = inner.Next();
      if (!next.ok()) return ArchiveError(src, next.status());
      if (!next->has_value()) return true;
    }
  }

 private:
  const CopySpec& spec_;
  Out out_;
  Budget budget_;
  const CancelFn& cancelled_;
  CopyResult result_;
};

}  // namespace

std::optional<std::string> NormalizeContextPath(std::string_view p) {
  std::string out;
  size_t i = 0;
  while (i <= p.size()) {
    size_t slash = p.find('/', i);
    if (slash == std::string_view::npos) slash = p.size();
    std::string_view c = p.substr(i, slash - i);
    i = slash + 1;
    if (c.empty() || c == ".") continue;
    if (c == "..") return std::nullopt;
    if (!out.empty()) out += '/';
    out.append(c);
  }
  return out;
}

absl::StatusOr<CopyResult> WriteCopyTar(const std::string& context_path, const CopySpec& spec,
                                        int out_fd, const CancelFn& cancelled) {
  // Sources, normalized; one that climbs out of the context can match nothing.
  std::vector<std::string> sources;
  for (const std::string& s : spec.sources) {
    auto n = NormalizeContextPath(s);
    if (!n) {
      return absl::InvalidArgumentError(
          fmt::format("COPY: \"{:.100}\" is outside the build context", s));
    }
    sources.push_back(*n);
  }
  auto dest_norm = NormalizeContextPath(spec.dest);
  if (!dest_norm) {
    return absl::InvalidArgumentError(fmt::format("COPY: bad destination \"{:.100}\"", spec.dest));
  }
  const std::string dest = *dest_norm;
  // DEST names a directory when it says so ("/app/", "/app/.") or the sources are several.
  const bool into_dir = sources.size() > 1 || spec.dest.empty() || spec.dest.back() == '/' ||
                        spec.dest.ends_with("/.") || spec.dest == "." ||
                        HasGlob(spec.sources.empty() ? "" : spec.sources[0]);

  UniqueFd in(::open(context_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return ErrnoStatus(errno, "build COPY: open the context " + context_path);
  // Not zeroed: a small context touches only the pages it is read into.
  std::unique_ptr<char[]> chunk(new char[kReadBytes]);
  archive::TarReader reader([&]() -> absl::StatusOr<std::string_view> {
    if (cancelled && cancelled()) return absl::CancelledError("build COPY: cancelled");
    for (;;) {
      ssize_t n = ::read(in.get(), chunk.get(), kReadBytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "build COPY: read the context");
      return std::string_view(chunk.get(), static_cast<size_t>(n));
    }
  });

  Writer w(spec, out_fd, cancelled);
  Spool spool(context_path);
  std::vector<bool> matched(sources.size(), false);
  std::map<std::string, std::string> renamed;  // context name -> output name (hard links)
  for (;;) {
    auto next = reader.Next();
    if (!next.ok()) return ContextError(next.status());
    if (!next->has_value()) break;
    TarEntry e = **next;
    auto name = ContextName(e.name);
    std::optional<std::string> target;
    bool itself = false;  // the item a source names, not an entry under it
    if (name && !name->empty()) {
      for (size_t i = 0; i < sources.size() && !target; ++i) {
        const std::string& s = sources[i];
        // The item a source names: itself, or (a glob) each entry its components match.
        std::optional<std::string> item;
        if (s.empty()) {
          item = "";
        } else if (HasGlob(s)) {
          auto p = Prefix(*name, Components(s));
          // As Docker's (Go's filepath.Match): `*` stays within a component and matches a
          // leading dot too.
          if (p && ::fnmatch(s.c_str(), p->c_str(), FNM_PATHNAME) == 0) item = p;
        } else if (*name == s || name->rfind(s + "/", 0) == 0) {
          item = s;
        }
        if (!item) continue;
        matched[i] = true;
        if (*name == *item) {
          // The named item itself: a directory gives its contents only; a file lands at DEST
          // or inside it.
          if (e.type == TarType::kDirectory) break;
          itself = true;
          target = into_dir ? Join(dest, Base(*name)) : dest;
        } else {
          target = Join(dest, name->substr(item->empty() ? 0 : item->size() + 1));
        }
      }
    }
    const bool keep = target && !target->empty() &&
                      (e.type == TarType::kFile || e.type == TarType::kDirectory ||
                       e.type == TarType::kSymlink || e.type == TarType::kHardLink);
    if (keep && e.type == TarType::kHardLink) {
      auto src = ContextName(e.linkname);
      auto it = src ? renamed.find(*src) : renamed.end();
      if (it == renamed.end()) {
        // Its target was not copied: the link has nothing to point at in the image.
        continue;
      }
      e.linkname = it->second;
    }
    const std::string what = name ? fmt::format("\"{:.100}\"", *name) : std::string();
    if (keep && itself && e.type == TarType::kFile && spec.unpack_archives) {
      // ADD of a file: read whole before it is known whether it is an archive, as Docker's
      // unpacking takes the source, not its entries (a file under a directory source is
      // copied as it is).
      SBX_ASSIGN_OR_RETURN(const int fd, spool.Empty());
      const absl::Status data = ReadData(reader, e, *name, [&](uint64_t o, std::string_view b) {
        return PWriteAll(fd, b, o);
      });
      if (!data.ok()) return ContextError(data);
      if (::ftruncate(fd, static_cast<off_t>(e.size)) != 0) {
        return ErrnoStatus(errno, "build ADD: ftruncate(spool)");
      }
      // Docker makes DEST a directory for the archive's contents, whatever its form.
      SBX_ASSIGN_OR_RETURN(const bool unpacked, w.Unpack(fd, *name, dest));
      if (unpacked) continue;
      renamed[*name] = *target;
      e.name = *target;
      SBX_RETURN_IF_ERROR(w.Header(e, /*charge_header=*/false, what));
      SBX_RETURN_IF_ERROR(w.CopySpool(fd, e.size));
      continue;
    }
    if (keep) {
      renamed[*name] = *target;
      e.name = *target;
      SBX_RETURN_IF_ERROR(w.Header(e, /*charge_header=*/false, what));
    }
    // The entry's data: copied when kept, read past otherwise.
    const absl::Status data = keep && e.type == TarType::kFile
                                  ? WriteFileData(reader, e, e.name, w.out())
                                  : ReadData(reader, e, e.name, nullptr);
    if (!data.ok()) return ContextError(data);
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!matched[i]) {
      return absl::InvalidArgumentError(fmt::format(
          "COPY: \"{:.100}\" is not in the build context", spec.sources[i]));
    }
  }
  w.out().buf().append(archive::TarTrailer());
  SBX_RETURN_IF_ERROR(w.out().Flush());
  CopyResult result = w.result();
  result.digest = w.out().Digest();
  result.bytes = w.out().bytes();
  return result;
}

}  // namespace sbx::image
