// Fuzz target for the client side of the attach stream (src/cli/sse_parser.h): the SSE parser
// and the binary-form parser that `sbx` and sbx-load feed with whatever a server sends (a
// broken or hostile one included). Properties: never crashes, throws or grows past its bound;
// the events do not depend on where the reads cut the bytes (the whole input at once, and the
// same input in pieces whose lengths come from the input itself, give the same events or both
// fail); the callback form (buffers reused from event to event) gives what the vector form
// gives; no binary event is handed out larger than the bound.
//
// An item (line or event) longer than the bound fails only where it must be held across reads:
// one that arrives whole in one read is handed out (it costs nothing to keep), so the cut input
// may fail where the whole one did not, and then gives a prefix of its events.
//
// Input: byte 0 picks the parser ('b' binary, anything else SSE), byte 1 the piece length
// (1..64); the rest is the stream.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cli/sse_parser.h"

namespace {

using sbx::cli::AttachEvent;
using sbx::cli::BinaryAttachParser;
using sbx::cli::SseEvent;
using sbx::cli::SseParser;

void Check(bool cond) {
  if (!cond) std::abort();
}

constexpr size_t kMax = 64;  // small, so that mutations reach the bound

bool Same(const SseEvent& a, const SseEvent& b) {
  return a.id == b.id && a.type == b.type && a.data == b.data;
}
bool Same(const AttachEvent& a, const AttachEvent& b) {
  return a.id == b.id && a.type == b.type && a.data == b.data && a.raw == b.raw &&
         a.offset == b.offset;
}

// The WHATWG event stream interpretation, line by line over the whole input: the lines a
// complete line end closes (CRLF, LF or CR), the incomplete last one dropped.
std::vector<SseEvent> ReferenceSse(std::string_view in) {
  if (in.substr(0, 3) == "\xEF\xBB\xBF") in.remove_prefix(3);
  std::vector<SseEvent> out;
  std::string data, type, last_id;
  bool has_data = false;
  size_t i = 0;
  for (;;) {
    const size_t end = in.find_first_of("\r\n", i);
    if (end == std::string_view::npos) break;
    const std::string_view line = in.substr(i, end - i);
    i = end + 1;
    if (in[end] == '\r' && i < in.size() && in[i] == '\n') ++i;
    if (line.empty()) {
      if (has_data) {
        if (!data.empty() && data.back() == '\n') data.pop_back();
        out.push_back(SseEvent{last_id, type.empty() ? "message" : type, data});
      }
      data.clear();
      type.clear();
      has_data = false;
      continue;
    }
    if (line[0] == ':') continue;
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (field == "data") {
      data.append(value);
      data.push_back('\n');
      has_data = true;
    } else if (field == "event") {
      type = std::string(value);
    } else if (field == "id" && value.find('\0') == std::string_view::npos) {
      last_id = std::string(value);
    }
  }
  return out;
}

// The binary form (docs/api.md): 24-byte big-endian headers, each followed by its payload;
// kinds 1-5 are events, the rest skipped; the id is the last non-zero one.
std::vector<AttachEvent> ReferenceBinary(std::string_view in) {
  static const char* const kKinds[] = {nullptr, "stdout", "stderr", "resync_required", "error",
                                       "process_exited"};
  auto be = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v = v << 8 | static_cast<uint8_t>(in[at + k]);
    return v;
  };
  std::vector<AttachEvent> out;
  std::string last_id;
  for (size_t at = 0; in.size() - at >= 24;) {
    const uint64_t length = be(at + 4, 4);
    if (in.size() - at - 24 < length) break;
    const auto kind = static_cast<uint8_t>(in[at]);
    if (const uint64_t id = be(at + 8, 8); id != 0) last_id = std::to_string(id);
    if (kind >= 1 && kind <= 5) {
      AttachEvent e{last_id, kKinds[kind], std::string(in.substr(at + 24, length))};
      e.raw = kind <= 2;
      e.offset = e.raw ? be(at + 16, 8) : 0;
      out.push_back(e);
    }
    at += 24 + length;
  }
  return out;
}

template <class Parser, class Event>
bool Whole(std::string_view in, std::vector<Event>* out) {
  Parser p(kMax);
  return p.Feed(in, out).ok();
}

// In pieces, through the callback form; stops at the first error, as a client must. SSE
// events are taken as the CLI takes them: their strings swapped out, which the parser allows.
template <class Parser, class Event>
bool Pieces(std::string_view in, size_t piece, std::vector<Event>* out) {
  Parser p(kMax);
  for (size_t at = 0; at < in.size(); at += piece) {
    bool ok;
    if constexpr (std::is_same_v<Event, SseEvent>) {
      ok = p.Feed(in.substr(at, piece), [&](SseEvent& e) {
             SseEvent kept;
             kept.id.swap(e.id);
             kept.type.swap(e.type);
             kept.data.swap(e.data);
             out->push_back(std::move(kept));
           }).ok();
    } else {
      ok = p.Feed(in.substr(at, piece), [&](const Event& e) { out->push_back(e); }).ok();
    }
    if (!ok) return false;
  }
  return true;
}

template <class Parser, class Event>
void Compare(std::string_view in, size_t piece, const std::vector<Event>& reference) {
  std::vector<Event> whole, cut;
  const bool ok_whole = Whole<Parser, Event>(in, &whole);
  if (ok_whole) {
    Check(whole.size() == reference.size());
    for (size_t i = 0; i < whole.size(); ++i) Check(Same(whole[i], reference[i]));
  }
  const bool ok_cut = Pieces<Parser, Event>(in, piece, &cut);
  if (!ok_whole) {
    Check(!ok_cut);  // the item held at the end is over the bound in pieces too
    return;
  }
  Check(ok_cut ? cut.size() == whole.size() : cut.size() <= whole.size());
  for (size_t i = 0; i < cut.size(); ++i) Check(Same(whole[i], cut[i]));
}

}  // namespace

extern const char* const kFuzzSeeds[] = {
    "s\x07id: 1\nevent: stdout\ndata: {\"data_b64\":\"aGk=\",\"offset\":0}\n\n: keepalive\n\n"
    "id: 2\nevent: process_exited\ndata: {\"exit_code\":0}\n\n",
    "s\x01\xEF\xBB\xBFid: 1\r\nevent: stderr\r\ndata: a\r\ndata: b\r\n\r\ndata:c\rretry: 10\r\r",
    "s\x05" "data\n\nevent: x\n\nid\nid: 3\x01\ndata: y\n\n\n",
    "b\x03\x01\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x07"
    "\x00\x00\x00\x00\x00\x00\x00\x00hi\n",
    "b\x09\x05\x00\x00\x00\x00\x00\x00\x0f\x00\x00\x00\x00\x00\x00\x00\x02"
    "\x00\x00\x00\x00\x00\x00\x00\x00{\"exit_code\":0}",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t piece = 1 + data[1] % 64;
  if (data[0] == 'b') {
    Compare<BinaryAttachParser, AttachEvent>(in, piece, ReferenceBinary(in));
  } else {
    Compare<SseParser, SseEvent>(in, piece, ReferenceSse(in));
  }
  return 0;
}
