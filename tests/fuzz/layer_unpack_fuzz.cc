// Fuzz target for the layer unpacker (src/image/layer_unpack.h): layer blobs are untrusted.
// Each input is written to a file and unpacked into a fresh directory with small limits.
// Properties: never crashes or throws; nothing is written outside the directory (a sentinel
// beside it stays alone and no file appears next to it); the directory is removable after a
// failure. Input bytes '~' stand for NUL so that the tar seeds survive as C strings.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "archive/tar.h"
#include "tar_seeds.h"
#include "image/layer_unpack.h"

namespace {
namespace fs = std::filesystem;
using sbx::archive::TarEntry;
using sbx::archive::TarType;

using sbx::fuzz::TarSeed;
const std::string kFiles = TarSeed({{TarEntry{"a/b", TarType::kFile, 0644, 0, 0, 1, 3, ""}, "abc"},
                                 {TarEntry{"a/.wh.c", TarType::kFile, 0644, 0, 0, 1, 0, ""}, ""},
                                 {TarEntry{"d/.wh..wh..opq", TarType::kFile, 0644, 0, 0, 1, 0, ""}, ""}});
const std::string kLinks = TarSeed({{TarEntry{"up", TarType::kSymlink, 0777, 0, 0, 1, 0, "../.."}, ""},
                                 {TarEntry{"up/x", TarType::kFile, 0644, 0, 0, 1, 1, ""}, "x"},
                                 {TarEntry{"h", TarType::kHardLink, 0644, 0, 0, 1, 0, "a/b"}, ""}});

struct Dirs {
  fs::path base;
  Dirs() {
    char t[] = "/tmp/sbx-layer-fuzz-XXXXXX";
    if (::mkdtemp(t) == nullptr) std::abort();
    base = t;
    std::ofstream(base / "sentinel") << "keep";
  }
};
Dirs& D() {
  static Dirs d;
  return d;
}
}  // namespace

extern const char* const kFuzzSeeds[] = {kFiles.c_str(), kLinks.c_str(), "", "ustar"};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string blob(reinterpret_cast<const char*>(data), size);
  for (char& c : blob) {
    if (c == '~') c = '\0';
  }
  const fs::path file = D().base / "blob", dest = D().base / "dest";
  { std::ofstream(file, std::ios::binary) << blob; }
  fs::create_directories(dest);
  (void)sbx::image::UnpackLayer(file.string(), dest.string(), "sha256:" + std::string(64, '0'),
                                sbx::image::UnpackLimits{1 << 20, 64}, {}, {});
  if (!sbx::image::RemoveTree(dest.string()).ok()) std::abort();
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(D().base)) {
    const auto name = e.path().filename().string();
    if (name != "sentinel" && name != "blob") std::abort();  // something escaped beside it
    ++n;
  }
  std::ifstream in(D().base / "sentinel");
  std::string s;
  in >> s;
  if (s != "keep" || n != 2) std::abort();
  return 0;
}
