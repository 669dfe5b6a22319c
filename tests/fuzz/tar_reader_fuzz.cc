// Fuzz target for the tar reader (src/archive/tar.h, libarchive underneath), which parses
// archives clients upload and the CLI downloads. Properties: never crashes or throws; the data
// handed out for an entry comes in order and never exceeds its declared size; names and link
// targets are non-empty and bounded. Input bytes '~' stand for NUL, so that the seeds (valid
// archives) survive as C strings.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "archive/tar.h"
#include "tar_seeds.h"

namespace {
using sbx::fuzz::TarSeed;
using sbx::archive::TarEntry;
using sbx::archive::TarType;
const std::string kSeed1 = TarSeed({{TarEntry{"a/b", TarType::kFile, 0644, 0, 0, 1, 3, ""}, "abc"},
                                 {TarEntry{"d", TarType::kDirectory, 0755, 0, 0, 1, 0, ""}, ""}});
const std::string kSeed2 =
    TarSeed({{TarEntry{std::string(300, 'n'), TarType::kSymlink, 0777, 0, 0, 1, 0,
                    std::string(200, 't')},
           ""}});
}  // namespace

extern const char* const kFuzzSeeds[] = {kSeed1.c_str(), kSeed2.c_str(), "", "ustar"};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  for (char& c : in) {
    if (c == '~') c = '\0';
  }
  // In two pieces, split where the input says, then the end of the input.
  const size_t cut = size > 0 ? data[0] % (size + 1) : 0;
  int pulls = 0;
  sbx::archive::TarReader r([&]() -> absl::StatusOr<std::string_view> {
    switch (pulls++) {
      case 0: return std::string_view(in).substr(0, cut);
      case 1: return std::string_view(in).substr(cut);
      default: return std::string_view();
    }
  });
  for (int entries = 0; entries < 100000; ++entries) {
    absl::StatusOr<std::optional<sbx::archive::TarEntry>> e = r.Next();
    if (!e.ok()) return 0;
    if (!e->has_value()) {
      (void)r.Drain();
      return 0;
    }
    const sbx::archive::TarEntry& entry = **e;
    if (entry.name.empty() || entry.name.size() > sbx::archive::kMaxTarNameBytes ||
        entry.linkname.size() > sbx::archive::kMaxTarNameBytes) {
      std::abort();
    }
    uint64_t end = 0;
    for (;;) {
      absl::StatusOr<sbx::archive::TarReader::Piece> p = r.Read();
      if (!p.ok()) return 0;
      if (p->bytes.empty()) break;
      // Pieces come in order and never beyond the entry's declared size.
      if (p->offset < end || p->offset + p->bytes.size() > entry.size) std::abort();
      end = p->offset + p->bytes.size();
    }
  }
  return 0;
}
