// Fuzz target for the tar reader (src/archive/tar.h), which parses archives clients
// upload. Properties: never crashes or throws; the data handed out for an entry never exceeds
// its declared size; entries end in order; names are non-empty and bounded. Input bytes '~'
// stand for NUL, so that the seeds (valid archives) survive as C strings.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "archive/tar.h"

namespace {
std::string Seed(std::initializer_list<std::pair<sbx::archive::TarEntry, std::string>> entries) {
  std::string out;
  for (const auto& [e, data] : entries) {
    (void)sbx::archive::AppendTarHeader(out, e);
    out += data;
    out.append(sbx::archive::TarPadding(data.size()));
  }
  out.append(sbx::archive::TarTrailer());
  // The drivers take seeds as C strings: NUL bytes travel as '~' (see below).
  for (char& c : out) {
    if (c == '\0') c = '~';
  }
  return out;
}
using sbx::archive::TarEntry;
using sbx::archive::TarType;
const std::string kSeed1 = Seed({{TarEntry{"a/b", TarType::kFile, 0644, 0, 0, 1, 3, ""}, "abc"},
                                 {TarEntry{"d", TarType::kDirectory, 0755, 0, 0, 1, 0, ""}, ""}});
const std::string kSeed2 =
    Seed({{TarEntry{std::string(300, 'n'), TarType::kSymlink, 0777, 0, 0, 1, 0,
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
  sbx::archive::TarReader r;
  uint64_t declared = 0, got = 0;
  bool open = false;
  r.on_entry = [&](const sbx::archive::TarEntry& e) {
    if (open || e.name.empty() || e.name.size() > sbx::archive::kMaxTarNameBytes) std::abort();
    declared = e.size;
    got = 0;
    open = true;
    return absl::OkStatus();
  };
  r.on_data = [&](std::string_view d) {
    if (!open) std::abort();
    got += d.size();
    if (got > declared) std::abort();
    return absl::OkStatus();
  };
  r.on_end_entry = [&] {
    if (!open) std::abort();
    open = false;
    return absl::OkStatus();
  };
  // In two pieces, split where the input says.
  const size_t cut = size > 0 ? data[0] % (size + 1) : 0;
  if (r.Feed(std::string_view(in).substr(0, cut)).ok()) {
    (void)r.Feed(std::string_view(in).substr(cut));
  }
  (void)r.Finish();
  return 0;
}
