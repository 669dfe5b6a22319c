// A generic mutation driver for fuzz targets when libFuzzer is unavailable (g++):
//   TARGET FILE...        runs the target once per file (corpus / crash replay)
//   TARGET --random N     mutates the target's seed inputs N times from a fixed seed
// Each target defines kFuzzSeeds/kFuzzSeedCount next to LLVMFuzzerTestOneInput.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern const char* const kFuzzSeeds[];
extern const size_t kFuzzSeedCount;

namespace {

std::string Mutate(std::string s, std::mt19937_64& rng) {
  static const char kTokens[][8] = {"{", "}", "[", "]", "\"", ":", ",", "null", "-1", "1e999",
                                    "\\u0000", "%", "%2", "?", "&", "=", "/", "\xff", "0"};
  int rounds = 1 + static_cast<int>(rng() % 6);
  for (int r = 0; r < rounds; ++r) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0:
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        if (!s.empty() && pos < s.size()) s.erase(pos, 1 + rng() % 8);
        break;
      case 2:
        s.insert(pos, kTokens[rng() % std::size(kTokens)]);
        break;
      case 3: {
        const char* other = kFuzzSeeds[rng() % kFuzzSeedCount];
        size_t len = std::strlen(other);
        size_t from = len ? rng() % len : 0;
        s.insert(pos, other + from, std::min<size_t>(len - from, 1 + rng() % 32));
        break;
      }
      default:
        if (pos <= s.size()) s.insert(pos, std::string(1 + rng() % 4, static_cast<char>(rng())));
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--random") == 0) {
    long n = std::strtol(argv[2], nullptr, 10);
    std::mt19937_64 rng(0x5b5);
    for (size_t i = 0; i < kFuzzSeedCount; ++i) {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(kFuzzSeeds[i]),
                             std::strlen(kFuzzSeeds[i]));
    }
    for (long i = 0; i < n; ++i) {
      std::string in = Mutate(kFuzzSeeds[rng() % kFuzzSeedCount], rng);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
    }
    std::printf("%ld mutated inputs, no crash\n", n);
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
  return 0;
}
