#include "archive/tar.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

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

// Numeric field: octal (spaces/NULs around), or base-256 (GNU) when the high bit is set.
bool GetNumber(const char* field, size_t width, uint64_t* out) {
  const auto* u = reinterpret_cast<const unsigned char*>(field);
  if (u[0] & 0x80) {
    if (u[0] != 0x80) return false;  // negative or oversized: refused
    uint64_t v = 0;
    for (size_t i = 1; i < width; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | u[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + static_cast<uint64_t>(field[i] - '0');
    any = true;
  }
  for (; i < width; ++i) {
    if (field[i] != ' ' && field[i] != '\0') return false;
  }
  *out = any ? v : 0;
  return true;
}

std::string Field(const char* p, size_t width) { return std::string(p, strnlen(p, width)); }

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

absl::Status TarReader::ApplyPax(std::string_view records, bool global) {
  while (!records.empty()) {
    const size_t sp = records.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp > 10) {
      return absl::InvalidArgumentError("tar: malformed pax record length");
    }
    uint64_t len = 0;
    for (size_t i = 0; i < sp; ++i) {
      if (records[i] < '0' || records[i] > '9') {
        return absl::InvalidArgumentError("tar: malformed pax record length");
      }
      len = len * 10 + static_cast<uint64_t>(records[i] - '0');
    }
    if (len <= sp + 1 || len > records.size() || records[len - 1] != '\n') {
      return absl::InvalidArgumentError("tar: malformed pax record");
    }
    std::string_view kv = records.substr(sp + 1, len - sp - 2);
    records.remove_prefix(len);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return absl::InvalidArgumentError("tar: pax record without '='");
    const std::string_view key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (global) continue;  // global defaults (mostly comments in practice) are ignored
    if (key == "path") {
      pax_path_ = std::string(value);
    } else if (key == "linkpath") {
      pax_linkpath_ = std::string(value);
    } else if (key == "size" || key == "mtime") {
      const std::string_view digits = value.substr(0, value.find('.'));
      int64_t v = 0;
      if (digits.empty() || digits.size() > 18) {
        return absl::InvalidArgumentError(fmt::format("tar: bad pax {}", key));
      }
      for (char c : digits) {
        if (c < '0' || c > '9') return absl::InvalidArgumentError(fmt::format("tar: bad pax {}", key));
        v = v * 10 + (c - '0');
      }
      (key == "size" ? pax_size_ : pax_mtime_) = v;
    }
  }
  return absl::OkStatus();
}

absl::Status TarReader::OnHeader(const char* h) {
  if (std::all_of(h, h + kTarBlock, [](char c) { return c == 0; })) {
    if (++zero_blocks_ == 2) state_ = State::kDone;
    return absl::OkStatus();
  }
  if (zero_blocks_ > 0) return absl::InvalidArgumentError("tar: data after a zero block");
  uint64_t sum = 0;
  if (!GetNumber(h + 148, 8, &sum)) return absl::InvalidArgumentError("tar: bad checksum field");
  uint64_t actual = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    actual += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  }
  if (sum != actual) return absl::InvalidArgumentError("tar: header checksum mismatch");
  uint64_t size = 0, mode = 0, uid = 0, gid = 0, mtime = 0;
  if (!GetNumber(h + 124, 12, &size) || !GetNumber(h + 100, 8, &mode) ||
      !GetNumber(h + 108, 8, &uid) || !GetNumber(h + 116, 8, &gid) ||
      !GetNumber(h + 136, 12, &mtime)) {
    return absl::InvalidArgumentError("tar: bad numeric field in a header");
  }
  const char type = h[156];
  if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
    if (size > kMaxPaxHeaderBytes) {
      return absl::InvalidArgumentError("tar: extended header larger than 64 KiB");
    }
    meta_type_ = type;
    meta_.clear();
    left_ = size;
    pad_left_ = TarPadding(size).size();
    state_ = State::kMeta;
    return absl::OkStatus();
  }
  TarEntry e;
  const bool ustar = std::memcmp(h + 257, "ustar", 5) == 0;
  std::string name = Field(h, 100);
  if (ustar && h[345] != '\0') name = Field(h + 345, 155) + "/" + name;
  if (!gnu_name_.empty()) name = gnu_name_;
  if (!pax_path_.empty()) name = pax_path_;
  e.linkname = Field(h + 157, 100);
  if (!gnu_link_.empty()) e.linkname = gnu_link_;
  if (!pax_linkpath_.empty()) e.linkname = pax_linkpath_;
  if (pax_size_ >= 0) size = static_cast<uint64_t>(pax_size_);
  e.mtime = pax_mtime_ != INT64_MIN ? pax_mtime_ : static_cast<int64_t>(mtime);
  pax_path_.clear();
  pax_linkpath_.clear();
  gnu_name_.clear();
  gnu_link_.clear();
  pax_size_ = -1;
  pax_mtime_ = INT64_MIN;
  switch (type) {
    case '0': case '\0': case '7': e.type = TarType::kFile; break;
    case '1': e.type = TarType::kHardLink; break;
    case '2': e.type = TarType::kSymlink; break;
    case '3': e.type = TarType::kCharDev; break;
    case '4': e.type = TarType::kBlockDev; break;
    case '5': e.type = TarType::kDirectory; break;
    case '6': e.type = TarType::kFifo; break;
    default: e.type = TarType::kOther; break;
  }
  // Old tars mark directories by a trailing '/' on a regular-file entry.
  if (e.type == TarType::kFile && !name.empty() && name.back() == '/') e.type = TarType::kDirectory;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  if (name.empty() || name.size() > kMaxTarNameBytes || e.linkname.size() > kMaxTarNameBytes) {
    return absl::InvalidArgumentError("tar: empty or over-long entry name");
  }
  e.name = std::move(name);
  e.mode = static_cast<uint32_t>(mode & 07777);
  e.uid = static_cast<uint32_t>(std::min<uint64_t>(uid, UINT32_MAX));
  e.gid = static_cast<uint32_t>(std::min<uint64_t>(gid, UINT32_MAX));
  // Only regular files carry data here; a size on anything else is skipped as data the
  // callbacks never see (hard links and directories may have one in odd archives).
  e.size = e.type == TarType::kFile || e.type == TarType::kOther ? size : 0;
  if (on_entry) {
    absl::Status s = on_entry(e);
    if (!s.ok()) return s;
  }
  in_file_ = true;
  left_ = size;
  pad_left_ = TarPadding(size).size();
  state_ = State::kData;
  if (left_ == 0) {
    in_file_ = false;
    state_ = pad_left_ ? State::kPadding : State::kHeader;
    if (on_end_entry) return on_end_entry();
  }
  return absl::OkStatus();
}

absl::Status TarReader::Feed(std::string_view bytes) {
  while (!bytes.empty()) {
    switch (state_) {
      case State::kDone:
        return absl::OkStatus();  // trailing bytes after the archive (block padding) ignored
      case State::kHeader: {
        const size_t take = std::min(bytes.size(), kTarBlock - block_.size());
        block_.append(bytes.substr(0, take));
        bytes.remove_prefix(take);
        if (block_.size() == kTarBlock) {
          const std::string h = std::move(block_);
          block_.clear();
          absl::Status s = OnHeader(h.data());
          if (!s.ok()) return s;
        }
        break;
      }
      case State::kData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes.size(), left_));
        if (on_data && take > 0) {
          absl::Status s = on_data(bytes.substr(0, take));
          if (!s.ok()) return s;
        }
        bytes.remove_prefix(take);
        left_ -= take;
        if (left_ == 0) {
          in_file_ = false;
          state_ = pad_left_ ? State::kPadding : State::kHeader;
          if (on_end_entry) {
            absl::Status s = on_end_entry();
            if (!s.ok()) return s;
          }
        }
        break;
      }
      case State::kMeta: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes.size(), left_));
        meta_.append(bytes.substr(0, take));
        bytes.remove_prefix(take);
        left_ -= take;
        if (left_ == 0) {
          if (meta_type_ == 'x' || meta_type_ == 'g') {
            absl::Status s = ApplyPax(meta_, meta_type_ == 'g');
            if (!s.ok()) return s;
          } else {
            std::string v = meta_.substr(0, strnlen(meta_.data(), meta_.size()));
            (meta_type_ == 'L' ? gnu_name_ : gnu_link_) = std::move(v);
          }
          meta_.clear();
          state_ = pad_left_ ? State::kPadding : State::kHeader;
        }
        break;
      }
      case State::kPadding: {
        const size_t take = std::min(bytes.size(), pad_left_);
        bytes.remove_prefix(take);
        pad_left_ -= take;
        if (pad_left_ == 0) state_ = State::kHeader;
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TarReader::Finish() const {
  if (state_ == State::kDone) return absl::OkStatus();
  if (state_ == State::kHeader && block_.empty() && !in_file_) return absl::OkStatus();
  return absl::InvalidArgumentError("tar: the archive ends in the middle of an entry");
}

}  // namespace sbx::archive
