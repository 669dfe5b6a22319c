#include "api/attach_events.h"

#include <algorithm>
#include <charconv>

#include "common/base64.h"

namespace sbx::api {
namespace {

void AppendUint(ByteBuffer& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(std::string_view(buf, static_cast<size_t>(end - buf)));
}

void AppendBE(ByteBuffer& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

void AppendBinaryHeader(ByteBuffer& out, BinaryKind kind, uint64_t id, uint64_t offset,
                        uint32_t length) {
  out.push_back(static_cast<char>(kind));
  out.append(std::string_view("\0\0\0", 3));
  AppendBE(out, length, 4);
  AppendBE(out, id, 8);
  AppendBE(out, offset, 8);
}

void AppendBinaryEvent(ByteBuffer& out, BinaryKind kind, uint64_t id, uint64_t offset,
                       std::string_view payload) {
  AppendBinaryHeader(out, kind, id, offset, static_cast<uint32_t>(payload.size()));
  out.append(payload);
}

std::string BinaryEvent(BinaryKind kind, uint64_t id, uint64_t offset, std::string_view payload) {
  ByteBuffer out;
  out.reserve(kBinaryHeaderBytes + payload.size());
  AppendBinaryEvent(out, kind, id, offset, payload);
  return std::string(out.view());
}

void AppendSseOutputEvent(ByteBuffer& out, uint64_t id, service::OutputStream stream,
                          uint64_t offset, std::string_view data) {
  // Room for the whole event (base64 plus at most ~90 bytes of framing) at once, growing
  // geometrically: an exact reserve per event would copy a batch of n events n times.
  const size_t need = out.size() + SseOutputEventSizeBound(data.size());
  if (out.capacity() < need) out.reserve(std::max(need, 2 * out.capacity()));
  if (id > 0) {
    out.append("id: ");
    AppendUint(out, id);
    out.push_back('\n');
  }
  out.append(stream == service::OutputStream::kStderr ? "event: stderr\ndata: {\"data_b64\":\""
                                                 : "event: stdout\ndata: {\"data_b64\":\"");
  Base64EncodeTo(data, out.Extend(Base64EncodedSize(data.size())));
  out.append("\",\"offset\":");
  AppendUint(out, offset);
  out.append("}\n\n");
}

std::string SseOutputEvent(uint64_t id, service::OutputStream stream, uint64_t offset,
                           std::string_view data) {
  ByteBuffer out;
  AppendSseOutputEvent(out, id, stream, offset, data);
  return std::string(out.view());
}

}  // namespace sbx::api
