// SSE wire form of the attach stream's output events (docs/api.md, DESIGN.md §3): the one
// place that turns a chunk of process output into bytes on the wire, so that the server, the
// micro-benchmarks and the unit tests all exercise the same code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "service/agent_types.h"

namespace sbx::api {

// Appends "id: <id>\nevent: stdout|stderr\ndata: {"data_b64":"<base64>","offset":<offset>}\n\n"
// to `out`: byte for byte what SseEvent() with nlohmann's compact dump of that object gives,
// built in place (base64 never needs JSON escaping), so that several events can share one
// buffer and one write. `id` 0 means no id line, as in SseEvent().
void AppendSseOutputEvent(std::string& out, uint64_t id, service::OutputStream stream,
                          uint64_t offset, std::string_view data);
// An upper bound of what AppendSseOutputEvent appends for `data_bytes` bytes of output.
inline size_t SseOutputEventSizeBound(size_t data_bytes) {
  return (data_bytes + 2) / 3 * 4 + 96;  // two 20-digit numbers and the fixed text fit in 96
}
std::string SseOutputEvent(uint64_t id, service::OutputStream stream, uint64_t offset,
                           std::string_view data);

}  // namespace sbx::api
