#include "api/attach_events.h"

#include <nlohmann/json.hpp>

#include "api/target.h"
#include "common/encoding.h"

namespace sbx::api {

std::string SseOutputEvent(uint64_t id, protocol::Stream stream, uint64_t offset,
                           std::string_view data) {
  nlohmann::json j = {{"data_b64", Base64Encode(data)}, {"offset", offset}};
  return SseEvent(id, stream == protocol::Stream::kStderr ? "stderr" : "stdout", j.dump());
}

}  // namespace sbx::api
