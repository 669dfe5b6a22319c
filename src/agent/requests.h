// The fields of the loop's requests (ops of src/protocol/protocol.h), read from the request's
// JSON object through the protocol's typed decoders (protocol/messages.h): one function per op
// (or per part of an op that is checked at its own step), so that the handlers act on typed
// values. The file ops' requests are decoded in files.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/spawn.h"
#include "protocol/messages.h"

namespace sbx::agent {

// The bounds are the protocol's (protocol/messages.h), which checks them when it decodes.
inline constexpr size_t kMaxSessionIdLength = protocol::kMaxSessionIdLength;
// Between the SIGTERM of a session's timeout and the SIGKILL, unless the spec says otherwise.
inline constexpr int kDefaultKillGraceS = static_cast<int>(protocol::kDefaultKillGraceS);
inline constexpr int kMaxKillGraceS = static_cast<int>(protocol::kMaxKillGraceS);
inline constexpr int64_t kMaxTimeoutS = static_cast<int64_t>(protocol::kMaxTimeoutS);

struct AttachRequest {
  std::string session_id;
  uint64_t after_event_id = 0;
  const protocol::Json* spec = nullptr;  // into the request; null when absent or null
};
absl::StatusOr<AttachRequest> ParseAttachRequest(const protocol::Json& req);

// The "spec" of a session's first attach.
struct SessionSpec {
  SpawnSpec spawn;  // argv, cwd, tty and its size, stdin_pipe; env and user are set later
  std::map<std::string, std::string> env;  // the caller's overlay
  int64_t timeout_s = 0;  // 0: none
  int kill_grace_s = kDefaultKillGraceS;
  std::string user;  // empty: the agent's own credentials
};
absl::StatusOr<SessionSpec> ParseSessionSpec(const protocol::Json& spec);

// "session_id" of status, stdin, stdin_close and resize; `op` prefixes the error.
absl::StatusOr<std::string> ParseSessionId(const protocol::Json& req, std::string_view op);

struct SignalRequest {
  std::string session_id;
  int signal = 0;  // 1..SIGRTMAX
};
absl::StatusOr<SignalRequest> ParseSignalRequest(const protocol::Json& req);

// The bytes of a stdin request ("data_b64", decoded).
absl::StatusOr<std::string> ParseStdinData(const protocol::Json& req);

struct WindowSize {
  unsigned short rows = 0, cols = 0;
};
// "rows" and "cols" of a resize request.
absl::StatusOr<WindowSize> ParseResizeSize(const protocol::Json& req);

}  // namespace sbx::agent
