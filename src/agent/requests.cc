#include "agent/requests.h"

#include <optional>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/status_util.h"
#include "protocol/messages.h"

namespace sbx::agent {
namespace {

using protocol::Json;

// A typed decode (protocol/messages.h) of a request the loop dispatched on its "op".
template <typename T>
absl::StatusOr<T> Decode(const Json& req) {
  return T::FromJson(req);
}

}  // namespace

absl::StatusOr<AttachRequest> ParseAttachRequest(const Json& req) {
  // The whole request, spec included, is checked here; the spec is read again (typed) only by
  // the attach that starts the session.
  SBX_ASSIGN_OR_RETURN(auto typed, Decode<protocol::AttachRequest>(req));
  AttachRequest r;
  r.session_id = std::move(typed.session_id);
  r.after_event_id = typed.after_event_id;
  if (auto spec = req.find("spec"); spec != req.end() && !spec->is_null()) r.spec = &*spec;
  return r;
}

absl::StatusOr<SessionSpec> ParseSessionSpec(const Json& spec) {
  SBX_ASSIGN_OR_RETURN(protocol::SessionSpec typed, protocol::SessionSpec::FromJson(spec));
  SessionSpec out;
  SpawnSpec& ss = out.spawn;
  ss.argv = std::move(typed.argv);
  // SpawnSpec's default "/" stays for an empty cwd.
  if (!typed.cwd.empty()) ss.cwd = std::move(typed.cwd);
  out.env = std::move(typed.env);
  if (typed.tty) {
    ss.tty = true;
    ss.rows = typed.tty->rows;
    ss.cols = typed.tty->cols;
  }
  ss.stdin_pipe = typed.stdin_pipe;
  out.timeout_s = static_cast<int64_t>(typed.timeout_s.value_or(0));
  out.kill_grace_s = static_cast<int>(typed.kill_grace_s.value_or(protocol::kDefaultKillGraceS));
  out.user = std::move(typed.user);
  return out;
}

absl::StatusOr<std::string> ParseSessionId(const Json& req, std::string_view op) {
  // Each op's own decoder: the id is read with the rest of the request's fields.
  if (op == "stdin") {
    SBX_ASSIGN_OR_RETURN(auto r, Decode<protocol::StdinRequest>(req));
    return std::move(r.session_id);
  }
  if (op == "stdin_close") {
    SBX_ASSIGN_OR_RETURN(auto r, Decode<protocol::StdinCloseRequest>(req));
    return std::move(r.session_id);
  }
  if (op == "resize") {
    SBX_ASSIGN_OR_RETURN(auto r, Decode<protocol::ResizeRequest>(req));
    return std::move(r.session_id);
  }
  SBX_ASSIGN_OR_RETURN(auto r, Decode<protocol::StatusRequest>(req));
  return std::move(r.session_id);
}

absl::StatusOr<SignalRequest> ParseSignalRequest(const Json& req) {
  SBX_ASSIGN_OR_RETURN(auto typed, Decode<protocol::SignalRequest>(req));
  return SignalRequest{std::move(typed.session_id), typed.signal};
}

absl::StatusOr<std::string> ParseStdinData(const Json& req) {
  SBX_ASSIGN_OR_RETURN(auto typed, Decode<protocol::StdinRequest>(req));
  auto decoded = Base64DecodePadded(typed.data_b64);
  if (!decoded) return absl::InvalidArgumentError("stdin: data_b64 is not base64");
  return std::move(*decoded);
}

absl::StatusOr<WindowSize> ParseResizeSize(const Json& req) {
  SBX_ASSIGN_OR_RETURN(auto typed, Decode<protocol::ResizeRequest>(req));
  return WindowSize{typed.rows, typed.cols};
}

}  // namespace sbx::agent
