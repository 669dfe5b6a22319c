#include "api/attach_events.h"

#include <charconv>

#include "common/encoding.h"

namespace sbx::api {
namespace {

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, static_cast<size_t>(end - buf));
}

}  // namespace

void AppendSseOutputEvent(std::string& out, uint64_t id, protocol::Stream stream,
                          uint64_t offset, std::string_view data) {
  // One reservation for the whole event: base64 output plus at most ~90 bytes of framing.
  out.reserve(out.size() + (data.size() + 2) / 3 * 4 + 96);
  if (id > 0) {
    out.append("id: ");
    AppendUint(out, id);
    out.push_back('\n');
  }
  out.append(stream == protocol::Stream::kStderr ? "event: stderr\ndata: {\"data_b64\":\""
                                                 : "event: stdout\ndata: {\"data_b64\":\"");
  Base64EncodeAppend(data, out);
  out.append("\",\"offset\":");
  AppendUint(out, offset);
  out.append("}\n\n");
}

std::string SseOutputEvent(uint64_t id, protocol::Stream stream, uint64_t offset,
                           std::string_view data) {
  std::string out;
  AppendSseOutputEvent(out, id, stream, offset, data);
  return out;
}

}  // namespace sbx::api
