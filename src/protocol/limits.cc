#include "protocol/limits.h"

namespace sbx::protocol {

uint32_t MaxFrameBytes(FrameType type, bool large_response) {
  switch (type) {
    case FrameType::kHello:
      return kMaxHelloBytes;
    case FrameType::kRequest:
      return kMaxSmallResponseBytes;  // the agent never sends one; a small bound is enough
    case FrameType::kResponse:
      return large_response ? kMaxGuestReplyBytes : kMaxSmallResponseBytes;
    case FrameType::kOutput:
      return kMaxOutputFrameBytes;
    case FrameType::kExit:
    case FrameType::kResync:
      return kMaxEventBytes;
    case FrameType::kData:
      return kMaxDataFrameBytes;
    case FrameType::kEnd:
      return kMaxEndBytes;
  }
  return kMaxSmallResponseBytes;
}

bool IsGuestSizedOp(std::string_view op) { return op == "processes" || op == "list"; }

}  // namespace sbx::protocol
