// SSE wire form of the attach stream's output events (docs/api.md, DESIGN.md §3): the one
// place that turns a chunk of process output into bytes on the wire, so that the server, the
// micro-benchmarks and the unit tests all exercise the same code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "protocol/protocol.h"

namespace sbx::api {

// "id: <id>\nevent: stdout|stderr\ndata: {"data_b64":"<base64>","offset":<offset>}\n\n"
std::string SseOutputEvent(uint64_t id, protocol::Stream stream, uint64_t offset,
                           std::string_view data);

}  // namespace sbx::api
