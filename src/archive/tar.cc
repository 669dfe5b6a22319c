#include "archive/tar.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::archive {
namespace {

constexpr char kZeros[2 * kTarBlock] = {};

// Octal field of `width` bytes: digits, then NUL. False when the value does not fit.
bool PutOctal(char* field, size_t width, uint64_t v) {
  std::string digits = fmt::format("{:o}", v);
  if (digits.size() > width - 1) return false;
  std::memset(field, '0', width - 1 - digits.size());
  std::memcpy(field + width - 1 - digits.size(), digits.data(), digits.size());
  field[width - 1] = '\0';
  return true;
}

void PaxRecord(std::string& out, std::string_view key, std::string_view value) {
  // "LEN key=value\n" where LEN counts the whole record, its own digits included.
  const size_t base = key.size() + value.size() + 3;  // ' ', '=', '\n'
  size_t len = base + 1;
  while (std::to_string(len).size() + base != len) ++len;
  out += fmt::format("{} {}={}\n", len, key, value);
}

void FinishHeader(char* h) {
  std::memcpy(h + 257, "ustar", 6);  // magic with its NUL
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) sum += static_cast<unsigned char>(h[i]);
  PutOctal(h + 148, 7, sum);  // 6 digits + NUL, then the space left from above
}

}  // namespace

std::string_view TarPadding(uint64_t size) {
  const size_t rem = static_cast<size_t>(size % kTarBlock);
  return rem == 0 ? std::string_view() : std::string_view(kZeros, kTarBlock - rem);
}

std::string_view TarTrailer() { return std::string_view(kZeros, sizeof(kZeros)); }

absl::Status AppendTarHeader(std::string& out, const TarEntry& e) {
  std::string name = e.name;
  if (e.type == TarType::kDirectory && (name.empty() || name.back() != '/')) name += '/';
  if (name.empty() || name.size() > kMaxTarNameBytes || e.linkname.size() > kMaxTarNameBytes) {
    return absl::InvalidArgumentError(fmt::format("tar: bad name or link for \"{}\"", e.name));
  }
  const uint64_t size = e.type == TarType::kFile ? e.size : 0;
  std::string pax;
  // ustar's name field (100) with the prefix field (155) split at a '/'.
  std::string ustar_name = name, prefix;
  if (ustar_name.size() > 100) {
    const size_t cut = name.find('/', name.size() > 101 ? name.size() - 101 : 0);
    if (cut != std::string::npos && cut <= 155 && name.size() - cut - 1 <= 100 && cut > 0) {
      prefix = name.substr(0, cut);
      ustar_name = name.substr(cut + 1);
    } else {
      PaxRecord(pax, "path", name);
      ustar_name = name.substr(0, 99);
    }
  }
  std::string link = e.linkname;
  if (link.size() > 100) {
    PaxRecord(pax, "linkpath", link);
    link = link.substr(0, 99);
  }
  constexpr uint64_t kMaxOctalSize = (uint64_t{1} << 33) - 1;  // 11 octal digits
  if (size > kMaxOctalSize) PaxRecord(pax, "size", std::to_string(size));
  if (!pax.empty()) {
    char h[kTarBlock] = {};
    const std::string pname = "PaxHeaders/" + ustar_name.substr(0, 80);
    std::memcpy(h, pname.data(), pname.size());
    PutOctal(h + 100, 8, 0644);
    PutOctal(h + 108, 8, 0);
    PutOctal(h + 116, 8, 0);
    PutOctal(h + 124, 12, pax.size());
    PutOctal(h + 136, 12, static_cast<uint64_t>(std::max<int64_t>(0, e.mtime)));
    h[156] = 'x';
    FinishHeader(h);
    out.append(h, kTarBlock);
    out += pax;
    out.append(TarPadding(pax.size()));
  }
  char h[kTarBlock] = {};
  std::memcpy(h, ustar_name.data(), std::min<size_t>(ustar_name.size(), 100));
  PutOctal(h + 100, 8, e.mode & 07777);
  if (!PutOctal(h + 108, 8, e.uid)) PutOctal(h + 108, 8, 0);
  if (!PutOctal(h + 116, 8, e.gid)) PutOctal(h + 116, 8, 0);
  if (!PutOctal(h + 124, 12, size)) PutOctal(h + 124, 12, 0);  // the pax size rules
  if (!PutOctal(h + 136, 12, static_cast<uint64_t>(std::max<int64_t>(0, e.mtime)))) {
    PutOctal(h + 136, 12, 0);
  }
  h[156] = static_cast<char>(e.type);
  std::memcpy(h + 157, link.data(), std::min<size_t>(link.size(), 100));
  std::memcpy(h + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
  FinishHeader(h);
  out.append(h, kTarBlock);
  return absl::OkStatus();
}

struct TarReader::Impl {
  ByteSource source;
  absl::Status source_error;  // the source's own error, returned as it is
  bool source_ended = false;
  bool opened = false;
  absl::Status open_status;  // kept: a failed open fails every later call the same way
  bool done = false;
  ::archive* a = nullptr;

  static la_ssize_t Pull(::archive* a, void* self, const void** buf) {
    Impl& impl = *static_cast<Impl*>(self);
    if (impl.source_ended) return 0;
    absl::StatusOr<std::string_view> piece = impl.source();
    if (!piece.ok()) {
      impl.source_error = piece.status();
      archive_set_error(a, EIO, "the input failed");
      return ARCHIVE_FATAL;
    }
    if (piece->empty()) {
      impl.source_ended = true;
      return 0;
    }
    *buf = piece->data();
    return static_cast<la_ssize_t>(piece->size());
  }

  absl::Status Error(std::string_view what) const {
    if (!source_error.ok()) return source_error;
    const char* why = archive_error_string(a);
    return absl::InvalidArgumentError(fmt::format("tar: {}", why != nullptr ? why : what));
  }

  absl::Status Open() {
    if (!opened) {
      opened = true;
      open_status = OpenOnce();
    }
    return open_status;
  }

  absl::Status OpenOnce() {
    a = archive_read_new();
    if (a == nullptr) return absl::ResourceExhaustedError("tar: archive_read_new failed");
    // Tar only (and an empty input, which is an empty archive): no compression filter and no
    // other format, so a client's bytes reach as little of libarchive as possible.
    if (archive_read_support_format_tar(a) != ARCHIVE_OK ||
        archive_read_support_format_empty(a) != ARCHIVE_OK ||
        archive_read_support_filter_none(a) != ARCHIVE_OK) {
      return Error("cannot enable the tar format");
    }
    if (archive_read_open(a, this, nullptr, &Impl::Pull, nullptr) != ARCHIVE_OK) {
      return Error("cannot open the input");
    }
    return absl::OkStatus();
  }

  ~Impl() {
    if (a != nullptr) archive_read_free(a);
  }
};

namespace {

TarType TypeOf(::archive_entry* ae) {
  if (archive_entry_hardlink(ae) != nullptr) return TarType::kHardLink;
  switch (archive_entry_filetype(ae)) {
    case AE_IFREG: return TarType::kFile;
    case AE_IFDIR: return TarType::kDirectory;
    case AE_IFLNK: return TarType::kSymlink;
    case AE_IFCHR: return TarType::kCharDev;
    case AE_IFBLK: return TarType::kBlockDev;
    case AE_IFIFO: return TarType::kFifo;
    default: return TarType::kOther;
  }
}

uint32_t Id(la_int64_t v) {
  return static_cast<uint32_t>(std::clamp<la_int64_t>(v, 0, UINT32_MAX));
}

}  // namespace

TarReader::TarReader(ByteSource source) : impl_(std::make_unique<Impl>()) {
  impl_->source = std::move(source);
}

TarReader::~TarReader() = default;

absl::StatusOr<std::optional<TarEntry>> TarReader::Next() {
  if (impl_->done) return std::nullopt;
  SBX_RETURN_IF_ERROR(impl_->Open());
  ::archive_entry* ae = nullptr;
  const int r = archive_read_next_header(impl_->a, &ae);
  if (r == ARCHIVE_EOF) {
    impl_->done = true;
    return std::nullopt;
  }
  // ARCHIVE_WARN is a name that does not convert to the locale's character set: libarchive
  // keeps its bytes as they are, which is what a file system wants.
  if (r < ARCHIVE_WARN) return impl_->Error("malformed header");
  TarEntry e;
  e.type = TypeOf(ae);
  const char* name = archive_entry_pathname(ae);
  e.name = name != nullptr ? name : "";
  while (e.name.size() > 1 && e.name.back() == '/') e.name.pop_back();
  const char* link = e.type == TarType::kHardLink ? archive_entry_hardlink(ae)
                                                  : archive_entry_symlink(ae);
  if (link != nullptr) e.linkname = link;
  if (e.name.empty() || e.name.size() > kMaxTarNameBytes || e.linkname.size() > kMaxTarNameBytes) {
    return absl::InvalidArgumentError("tar: empty or over-long entry name");
  }
  e.mode = static_cast<uint32_t>(archive_entry_perm(ae) & 07777);
  e.uid = Id(archive_entry_uid(ae));
  e.gid = Id(archive_entry_gid(ae));
  e.mtime = archive_entry_mtime(ae);
  e.size = e.type == TarType::kFile && archive_entry_size_is_set(ae)
               ? static_cast<uint64_t>(std::max<la_int64_t>(0, archive_entry_size(ae)))
               : 0;
  return e;
}

absl::StatusOr<TarReader::Piece> TarReader::Read() {
  if (impl_->done || impl_->a == nullptr) return Piece{};
  const void* buf = nullptr;
  size_t len = 0;
  la_int64_t offset = 0;
  int r = ARCHIVE_OK;
  // An empty block is not the end (a sparse entry may report one): only ARCHIVE_EOF is.
  do {
    r = archive_read_data_block(impl_->a, &buf, &len, &offset);
  } while (r == ARCHIVE_OK && len == 0);
  if (r == ARCHIVE_EOF) return Piece{};
  if (r < ARCHIVE_WARN) return impl_->Error("malformed data");
  return Piece{static_cast<uint64_t>(std::max<la_int64_t>(0, offset)),
               std::string_view(static_cast<const char*>(buf), len)};
}

absl::Status TarReader::Drain() {
  while (!impl_->source_ended) {
    SBX_ASSIGN_OR_RETURN(std::string_view piece, impl_->source());
    if (piece.empty()) impl_->source_ended = true;
  }
  return absl::OkStatus();
}

}  // namespace sbx::archive
