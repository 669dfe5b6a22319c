// Fuzz target for COPY's selection of build-context entries (src/image/build_context.h): the
// context tar is a client's upload. Each input is written to a file (made once per process)
// and copied with a few fixed COPY steps into /dst/; the low bit of the input's last byte (past
// a tar's trailer, which the reader never gets to) makes them ADD steps, which unpack a source
// file that is an archive. Properties: never crashes or throws; a successful copy's tar (written
// to a memfd) reads back whole, every entry of it lies under dst/ (no `..` component, no leading
// '/'), a hard link points at an entry of the output, owners are 0, its files' data is within
// max_bytes, and its digest, size and entry count are those of the file written. Input bytes
// '~' stand for NUL so that the tar seeds survive as C strings.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <archive.h>
#include <archive_entry.h>

#include "archive/tar.h"
#include "common/digest.h"
#include "image/build_context.h"
#include "tar_seeds.h"

namespace {
using sbx::archive::TarEntry;
using sbx::archive::TarType;
using sbx::fuzz::TarSeed;

const std::string kTree =
    TarSeed({{TarEntry{"./", TarType::kDirectory, 0755, 1, 1, 1, 0, ""}, ""},
             {TarEntry{"./a", TarType::kDirectory, 0755, 1, 1, 1, 0, ""}, ""},
             {TarEntry{"./a/x.txt", TarType::kFile, 0644, 1, 1, 1, 3, ""}, "abc"},
             {TarEntry{"./a/s", TarType::kSymlink, 0777, 1, 1, 1, 0, "../../etc"}, ""},
             {TarEntry{"b.txt", TarType::kFile, 0600, 1, 1, 1, 1, ""}, "b"},
             {TarEntry{"h", TarType::kHardLink, 0644, 1, 1, 1, 0, "a/x.txt"}, ""},
             {TarEntry{"a/h2", TarType::kHardLink, 0644, 1, 1, 1, 0, "b.txt"}, ""}});
const std::string kHostile =
    TarSeed({{TarEntry{"../evil.txt", TarType::kFile, 0644, 0, 0, 1, 1, ""}, "e"},
             {TarEntry{"/a/abs.txt", TarType::kFile, 0644, 0, 0, 1, 1, ""}, "a"},
             {TarEntry{"a/../../up.txt", TarType::kFile, 0644, 0, 0, 1, 1, ""}, "u"},
             {TarEntry{"a//./y.txt", TarType::kFile, 0644, 0, 0, 1, 1, ""}, "y"},
             {TarEntry{"a/l", TarType::kHardLink, 0644, 0, 0, 1, 0, "../evil.txt"}, ""},
             {TarEntry{"a/fifo", TarType::kFifo, 0644, 0, 0, 1, 0, ""}, ""}});

std::string PaxRecord(const std::string& key, const std::string& value) {
  const size_t base = key.size() + value.size() + 3;
  size_t len = base + 1;
  while (std::to_string(len).size() + base != len) ++len;
  return std::to_string(len) + " " + key + "=" + value + "\n";
}

// One header block of `type` (which the project's writer does not make).
std::string RawHeader(const std::string& name, char type, uint64_t size) {
  std::string h;
  (void)sbx::archive::AppendTarHeader(h, TarEntry{name, TarType::kFile, 0644, 0, 0, 1, size, ""});
  h[156] = type;
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

// A sparse entry (pax GNU.sparse 0.1) whose map holds more data than its size: the data's
// second block is a header that would smuggle "../evil" into a copy that trusted the size.
std::string SparseSeed() {
  std::string smuggled;
  (void)sbx::archive::AppendTarHeader(smuggled,
                                      TarEntry{"../evil", TarType::kFile, 0644, 0, 0, 1, 0, ""});
  const std::string data = std::string(512, 'A') + smuggled;
  const std::string pax = PaxRecord("GNU.sparse.size", "1") +
                          PaxRecord("GNU.sparse.numblocks", "1") +
                          PaxRecord("GNU.sparse.map", "0," + std::to_string(data.size()));
  std::string tar = RawHeader("a/PaxHeaders/s.txt", 'x', pax.size());
  tar += pax;
  tar.append(sbx::archive::TarPadding(pax.size()));
  tar += RawHeader("a/s.txt", '0', data.size());
  tar += data;
  tar.append(sbx::archive::TarTrailer());
  for (char& c : tar) {
    if (c == '\0') c = '~';
  }
  return tar;
}
const std::string kSparse = SparseSeed();

constexpr uint64_t kMaxBytes = 1 << 20;

// `data` gzipped by libarchive's writer (the magic the ADD steps detect); `salt` changes its
// bytes.
std::string Gzip(const std::string& data, int salt) {
  std::string out;
  ::archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_raw(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open(
      a, &out, nullptr,
      [](::archive*, void* client, const void* buf, size_t n) -> la_ssize_t {
        static_cast<std::string*>(client)->append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  ::archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, "data");
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_mtime(e, salt, 0);
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  archive_write_header(a, e);
  archive_write_data(a, data.data(), data.size());
  archive_write_close(a);
  archive_entry_free(e);
  archive_write_free(a);
  return out;
}

// Contexts whose *.txt files are archives, with an odd last byte: ADD steps. In the first,
// n.txt is a tar (a directory, a file, a symlink, hard links, a FIFO), m.txt the same gzipped
// (with no '~' in its bytes, which would become NUL), b.txt not an archive; in the second,
// e.txt has a `..` name after a good one.
std::string Inner(std::initializer_list<std::pair<TarEntry, std::string>> entries) {
  std::string t = TarSeed(entries);
  for (char& c : t) {
    if (c == '~') c = '\0';
  }
  return t;
}
std::string ArchiveSeed() {
  const std::string inner =
      Inner({{TarEntry{"./", TarType::kDirectory, 0755, 1, 1, 1, 0, ""}, ""},
             {TarEntry{"d", TarType::kDirectory, 0700, 1, 1, 1, 0, ""}, ""},
             {TarEntry{"d/f", TarType::kFile, 0644, 1, 1, 1, 2, ""}, "ff"},
             {TarEntry{"d/s", TarType::kSymlink, 0777, 1, 1, 1, 0, "../.."}, ""},
             {TarEntry{"d/h", TarType::kHardLink, 0644, 1, 1, 1, 0, "d/f"}, ""},
             {TarEntry{"d/h2", TarType::kHardLink, 0644, 1, 1, 1, 0, "x"}, ""},
             {TarEntry{"p", TarType::kFifo, 0644, 1, 1, 1, 0, ""}, ""}});
  std::string gz;
  for (int salt = 1; salt < 1000; ++salt) {
    gz = Gzip(inner, salt);
    if (gz.find('~') == std::string::npos) break;
  }
  return TarSeed({{TarEntry{"n.txt", TarType::kFile, 0644, 1, 1, 1, inner.size(), ""}, inner},
                  {TarEntry{"m.txt", TarType::kFile, 0644, 1, 1, 1, gz.size(), ""}, gz},
                  {TarEntry{"b.txt", TarType::kFile, 0644, 1, 1, 1, 1, ""}, "b"}}) +
         "U";
}
std::string EvilArchiveSeed() {
  const std::string evil = Inner({{TarEntry{"ok", TarType::kFile, 0644, 1, 1, 1, 1, ""}, "o"},
                                  {TarEntry{"../up", TarType::kFile, 0644, 1, 1, 1, 1, ""}, "u"}});
  return TarSeed({{TarEntry{"e.txt", TarType::kFile, 0644, 1, 1, 1, evil.size(), ""}, evil}}) +
         "U";
}
const std::string kArchives = ArchiveSeed();
const std::string kEvilArchive = EvilArchiveSeed();
const std::string kTreeAdd = kTree + "U";

// The context's file and the output (a memfd). The context is rewritten in place and cut to
// size rather than truncated to 0 first: on ext4 that would flush it at every close.
struct Files {
  std::string context;
  int out = -1;
  Files() {
    char t[] = "/tmp/sbx-build-context-fuzz-XXXXXX";
    if (::mkdtemp(t) == nullptr) std::abort();
    context = std::string(t) + "/context.tar";
    out = ::memfd_create("build-context-fuzz-out", MFD_CLOEXEC);
    if (out < 0) std::abort();
  }
};
Files& F() {
  static Files f;
  return f;
}

void WriteContext(const std::string& bytes) {
  const int fd = ::open(F().context.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::pwrite(fd, bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(done));
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes.size())) != 0 || ::close(fd) != 0) std::abort();
}

std::string ReadOut(int fd) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), static_cast<off_t>(out.size()));
    if (n < 0) std::abort();
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

bool HasDotDot(std::string_view name) {
  size_t i = 0;
  while (i <= name.size()) {
    size_t slash = name.find('/', i);
    if (slash == std::string_view::npos) slash = name.size();
    if (name.substr(i, slash - i) == "..") return true;
    i = slash + 1;
  }
  return false;
}

bool Contained(const std::string& name) {
  return name.rfind("dst/", 0) == 0 && !HasDotDot(name);
}

// The output of a successful copy, checked.
void Check(const sbx::image::CopyResult& r, int fd) {
  uint64_t data = 0;
  const std::string bytes = ReadOut(fd);
  if (r.digest != sbx::Sha256Digest(bytes) || r.bytes != bytes.size()) std::abort();
  bool given = false;
  sbx::archive::TarReader reader([&]() -> absl::StatusOr<std::string_view> {
    if (given) return std::string_view();
    given = true;
    return std::string_view(bytes);
  });
  std::set<std::string> names;
  uint64_t entries = 0;
  for (;;) {
    auto next = reader.Next();
    if (!next.ok()) std::abort();  // our own tar must read back
    if (!next->has_value()) break;
    const TarEntry& e = **next;
    ++entries;
    if (!Contained(e.name) || e.uid != 0 || e.gid != 0) std::abort();
    if (e.type != TarType::kFile && e.type != TarType::kDirectory &&
        e.type != TarType::kSymlink && e.type != TarType::kHardLink) {
      std::abort();
    }
    if (e.type == TarType::kHardLink && names.count(e.linkname) == 0) std::abort();
    names.insert(e.name);
    uint64_t got = 0;
    for (;;) {
      auto piece = reader.Read();
      if (!piece.ok()) std::abort();
      if (piece->bytes.empty()) break;
      got = piece->offset + piece->bytes.size();
    }
    if (got > e.size) std::abort();
    data += e.size;
  }
  if (entries != r.entries || data > kMaxBytes) std::abort();
}

}  // namespace

extern const char* const kFuzzSeeds[] = {
    kTree.c_str(),         kHostile.c_str(), kSparse.c_str(), kArchives.c_str(),
    kEvilArchive.c_str(), kTreeAdd.c_str(), "",               "ustar"};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string blob(reinterpret_cast<const char*>(data), size);
  for (char& c : blob) {
    if (c == '~') c = '\0';
  }
  WriteContext(blob);
  const bool add = size > 0 && (data[size - 1] & 1) != 0;
  const std::vector<std::string> sources[] = {{"."}, {"a"}, {"*.txt"}};
  for (const auto& s : sources) {
    const int fd = F().out;
    if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) != 0) std::abort();
    sbx::image::CopySpec spec{s, "/dst/", std::nullopt};
    spec.unpack_archives = add;
    spec.max_bytes = kMaxBytes;
    auto r = sbx::image::WriteCopyTar(F().context, spec, fd, {});
    if (r.ok()) Check(*r, fd);
  }
  return 0;
}
