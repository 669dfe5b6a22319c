#include "api/attach_events.h"

#include <algorithm>
#include <charconv>

#include "common/base64.h"

namespace sbx::api {
namespace {

void AppendUint(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, static_cast<size_t>(end - buf));
}

}  // namespace

void AppendSseOutputEvent(std::string& out, uint64_t id, service::OutputStream stream,
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
  Base64EncodeAppend(data, out);
  out.append("\",\"offset\":");
  AppendUint(out, offset);
  out.append("}\n\n");
}

std::string SseOutputEvent(uint64_t id, service::OutputStream stream, uint64_t offset,
                           std::string_view data) {
  std::string out;
  AppendSseOutputEvent(out, id, stream, offset, data);
  return out;
}

}  // namespace sbx::api
