#include "image/build_context.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <cerrno>
#include <map>

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
  std::string chunk(kReadBytes, '\0');
  archive::TarReader reader([&]() -> absl::StatusOr<std::string_view> {
    if (cancelled && cancelled()) return absl::CancelledError("build COPY: cancelled");
    for (;;) {
      ssize_t n = ::read(in.get(), chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "build COPY: read the context");
      return std::string_view(chunk.data(), static_cast<size_t>(n));
    }
  });

  Out out(out_fd);
  std::vector<bool> matched(sources.size(), false);
  std::map<std::string, std::string> renamed;  // context name -> output name (hard links)
  CopyResult result;
  for (;;) {
    auto next = reader.Next();
    if (!next.ok()) return ContextError(next.status());
    if (!next->has_value()) break;
    TarEntry e = **next;
    auto name = ContextName(e.name);
    std::optional<std::string> target;
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
    if (keep) {
      renamed[*name] = *target;
      e.name = *target;
      e.uid = e.gid = 0;
      if (spec.chmod && e.type != TarType::kSymlink) e.mode = *spec.chmod;
      if (e.type != TarType::kFile) e.size = 0;
      SBX_RETURN_IF_ERROR(archive::AppendTarHeader(out.buf(), e));
      ++result.entries;
    }
    // The entry's data: copied when kept, read past otherwise.
    uint64_t written = 0;
    for (;;) {
      auto piece = reader.Read();
      if (!piece.ok()) return ContextError(piece.status());
      if (piece->bytes.empty()) break;
      if (!keep || e.type != TarType::kFile) continue;
      // A sparse map may place data past the entry's size, or go back: what follows the header
      // must be exactly e.size bytes, or the rest would read as entries of the image.
      if (piece->offset < written || piece->offset > e.size ||
          piece->bytes.size() > e.size - piece->offset) {
        return absl::InvalidArgumentError(fmt::format(
            "build context: \"{:.100}\": data beyond the entry's size", e.name));
      }
      if (piece->offset > written) {  // a sparse entry's hole
        out.buf().append(piece->offset - written, '\0');
        written = piece->offset;
      }
      out.buf().append(piece->bytes);
      written += piece->bytes.size();
      SBX_RETURN_IF_ERROR(out.Maybe());
    }
    if (keep && e.type == TarType::kFile) {
      if (written < e.size) out.buf().append(e.size - written, '\0');
      out.buf().append(archive::TarPadding(e.size));
    }
    SBX_RETURN_IF_ERROR(out.Maybe());
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!matched[i]) {
      return absl::InvalidArgumentError(fmt::format(
          "COPY: \"{:.100}\" is not in the build context", spec.sources[i]));
    }
  }
  out.buf().append(archive::TarTrailer());
  SBX_RETURN_IF_ERROR(out.Flush());
  result.digest = out.Digest();
  result.bytes = out.bytes();
  return result;
}

}  // namespace sbx::image
