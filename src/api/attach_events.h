// Wire forms of the attach stream's events (docs/api.md, "attach"): SSE (the default) and the
// binary framing a client asks for. The one place that turns a chunk of process output into
// bytes on the wire, so that the server, the micro-benchmarks and the unit tests all exercise
// the same code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/byte_buffer.h"
#include "service/agent_types.h"

namespace sbx::api {

// Appends "id: <id>\nevent: stdout|stderr\ndata: {"data_b64":"<base64>","offset":<offset>}\n\n"
// to `out`: byte for byte what SseEvent() with nlohmann's compact dump of that object gives,
// built in place (base64 never needs JSON escaping), so that several events can share one
// buffer and one write. A ByteBuffer: the base64 is written into room that was not zeroed
// first. `id` 0 means no id line, as in SseEvent().
void AppendSseOutputEvent(ByteBuffer& out, uint64_t id, service::OutputStream stream,
                          uint64_t offset, std::string_view data);
// An upper bound of what AppendSseOutputEvent appends for `data_bytes` bytes of output.
inline size_t SseOutputEventSizeBound(size_t data_bytes) {
  return (data_bytes + 2) / 3 * 4 + 96;  // two 20-digit numbers and the fixed text fit in 96
}
std::string SseOutputEvent(uint64_t id, service::OutputStream stream, uint64_t offset,
                           std::string_view data);

// The binary attach stream (Content-Type application/vnd.sbx.attach+binary): per event a
// 24-byte header, all numbers big-endian,
//   byte 0 kind, bytes 1-3 zero, bytes 4-7 payload length (u32),
//   bytes 8-15 event id (u64; 0 where SSE sends no id: keep-alive, resync, error),
//   bytes 16-23 byte offset of the chunk in its stream (u64; stdout/stderr, else 0),
// then the payload: the raw output bytes, or the JSON of SSE's `data:` for the other kinds.
// No base64 and no JSON per output chunk: the output bytes go out as the agent sent them.
inline constexpr std::string_view kBinaryAttachContentType = "application/vnd.sbx.attach+binary";
enum class BinaryKind : uint8_t {
  kKeepalive = 0,  // length 0: what SSE's ": keepalive" comment is
  kStdout = 1,
  kStderr = 2,
  kResyncRequired = 3,
  kError = 4,
  kProcessExited = 5,
};
inline constexpr size_t kBinaryHeaderBytes = 24;
void AppendBinaryHeader(ByteBuffer& out, BinaryKind kind, uint64_t id, uint64_t offset,
                        uint32_t length);
// Header and payload.
void AppendBinaryEvent(ByteBuffer& out, BinaryKind kind, uint64_t id, uint64_t offset,
                       std::string_view payload);
std::string BinaryEvent(BinaryKind kind, uint64_t id, uint64_t offset, std::string_view payload);

}  // namespace sbx::api
