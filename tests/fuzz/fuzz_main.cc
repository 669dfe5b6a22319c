// A minimal stand-in for libFuzzer's driver (g++ has no -fsanitize=fuzzer):
//   frame_decoder_fuzz FILE...        runs the target once per file (corpus / crash replay)
//   frame_decoder_fuzz --random N     runs it on N pseudo-random inputs from a fixed seed
// The random inputs are biased towards well-formed frames so that the payload decoders are
// reached, not only the header check.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void PutBE(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// Nested past the payload depth limit (common/json_util.h), and at it.
const std::string kDeepExit = R"({"event_id":1,"exit_code":)" + std::string(100000, '[') +
                              std::string(100000, ']') + "}";
const std::string kDeepResync = R"({"oldest_available_id":)" + std::string(64, '[') +
                                std::string(64, ']') + "}";

const char* const kJsonSnippets[] = {
    kDeepExit.c_str(), kDeepResync.c_str(),
    R"({"event_id":1,"exit_code":0,"signal":null,"timed_out":false,"oom_killed":false})",
    R"({"event_id":18446744073709551615,"signal":"SIGKILL"})",
    R"({"oldest_available_id":3,"stdout_offset":10,"stderr_offset":0})",
    R"({"event_id":-1})", R"({"exit_code":1e400})", "[1,2,3]", "{\"a\":\"\\ud800\"}",
    "{\"event_id\":1,\"signal\":\"\xff\"}", "null", "{", "",
};

std::string RandomFrame(std::mt19937_64& rng) {
  std::string payload;
  uint8_t type = static_cast<uint8_t>(1 + rng() % 6);
  switch (rng() % 4) {
    case 0: {  // output event
      PutBE(payload, rng(), 8);
      payload.push_back(static_cast<char>(rng() % 4));
      PutBE(payload, rng(), 8);
      size_t n = rng() % 64;
      for (size_t i = 0; i < n; ++i) payload.push_back(static_cast<char>(rng()));
      type = 4;
      break;
    }
    case 1:
      payload = kJsonSnippets[rng() % std::size(kJsonSnippets)];
      type = rng() % 2 ? 5 : 6;
      break;
    default: {
      size_t n = rng() % 48;
      for (size_t i = 0; i < n; ++i) payload.push_back(static_cast<char>(rng()));
    }
  }
  std::string frame;
  uint32_t length = static_cast<uint32_t>(payload.size());
  if (rng() % 50 == 0) length = static_cast<uint32_t>(rng());  // lie about the length
  PutBE(frame, length, 4);
  frame.push_back(static_cast<char>(rng() % 40 == 0 ? rng() : 1));      // version
  frame.push_back(static_cast<char>(rng() % 40 == 0 ? rng() : type));   // type
  PutBE(frame, rng() % 40 == 0 ? rng() : 0, 2);                         // reserved
  return frame + payload;
}

std::string RandomInput(std::mt19937_64& rng) {
  std::string in;
  if (rng() % 5 == 0) {  // pure noise
    size_t n = rng() % 256;
    for (size_t i = 0; i < n; ++i) in.push_back(static_cast<char>(rng()));
    return in;
  }
  in.push_back(static_cast<char>(rng()));  // chunking selector byte... and part of the stream
  size_t frames = rng() % 6;
  for (size_t i = 0; i < frames; ++i) in += RandomFrame(rng);
  if (rng() % 3 == 0 && !in.empty()) in.resize(rng() % in.size());  // truncate
  if (rng() % 4 == 0 && !in.empty()) in[rng() % in.size()] ^= static_cast<char>(1 << (rng() % 8));
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--random") == 0) {
    long n = std::strtol(argv[2], nullptr, 10);
    std::mt19937_64 rng(0x5b7a6e7dULL);
    for (long i = 0; i < n; ++i) {
      std::string in = RandomInput(rng);
      // The target takes the chunking selector from byte 0; without it the frames would be
      // misaligned by one byte, so half the inputs drop it.
      if (i % 2 == 0 && !in.empty()) in.erase(0, 1);
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
    }
    std::printf("frame_decoder_fuzz: %ld random inputs OK\n", n);
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE... | --random N\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "frame_decoder_fuzz: cannot read %s\n", argv[i]);
      return 2;
    }
    std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
  std::printf("frame_decoder_fuzz: %d inputs OK\n", argc - 1);
  return 0;
}
