// Fuzz target for the agent protocol decoders: every byte string must either decode or be
// rejected with a status, never crash, throw or loop. Runs under libFuzzer (clang
// -fsanitize=fuzzer) or under fuzz_main.cc with g++.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "protocol/protocol.h"

namespace {

using namespace sbx::protocol;

void CheckPayload(const Frame& f) {
  switch (f.type) {
    case FrameType::kOutput: {
      auto ev = DecodeOutput(f.payload);
      if (ev.ok()) {
        // Re-encoding a decoded event must reproduce the payload exactly.
        if (EncodeOutput(*ev) != f.payload) std::abort();
      }
      break;
    }
    case FrameType::kExit: {
      auto ev = DecodeExit(f.payload);
      if (ev.ok()) {
        auto again = DecodeExit(EncodeExit(*ev));
        if (!again.ok() || again->event_id != ev->event_id || again->exit_code != ev->exit_code ||
            again->signal != ev->signal) {
          std::abort();
        }
      }
      break;
    }
    case FrameType::kResync: {
      auto ev = DecodeResync(f.payload);
      if (ev.ok()) {
        auto again = DecodeResync(EncodeResync(*ev));
        if (!again.ok() || again->oldest_available_id != ev->oldest_available_id) std::abort();
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);

  // The first byte picks how the input is split into Feed() calls, so chunking bugs surface.
  size_t step = size > 0 ? (data[0] % 17) + 1 : 1;
  FrameDecoder decoder;
  size_t consumed = 0;
  bool dead = false;
  for (size_t pos = 0; pos < size && !dead; pos += step) {
    decoder.Feed(in.substr(pos, step));
    for (;;) {
      auto next = decoder.Next();
      if (!next.ok()) {
        dead = true;
        break;
      }
      if (!next->has_value()) break;
      const Frame& f = **next;
      if (f.payload.size() > kMaxPayload) std::abort();
      consumed += kHeaderSize + f.payload.size();
      CheckPayload(f);
      // Re-encoding the frame gives back exactly the bytes that were consumed.
      std::string again = EncodeFrame(f.type, f.payload);
      if (in.substr(consumed - again.size(), again.size()) != again) std::abort();
    }
  }
  if (!dead && consumed + decoder.buffered() != size) std::abort();

  // The raw input as each payload kind, and the header check on its first 8 bytes.
  (void)DecodeOutput(in);
  (void)DecodeExit(in);
  (void)DecodeResync(in);
  if (size >= kHeaderSize) (void)DecodeHeader(data);
  (void)SignalNumber(in);
  return 0;
}
