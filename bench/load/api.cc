#include "load/api.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/status_util.h"

namespace sbx::load {
namespace {

absl::StatusOr<std::string> StringField(const nlohmann::json& j, const char* a,
                                        const char* b = nullptr) {
  const nlohmann::json* p = &j;
  for (const char* key : {a, b}) {
    if (key == nullptr) break;
    if (!p->is_object() || !p->contains(key)) {
      return absl::InternalError(fmt::format("response has no \"{}\": {}", key,
                                             j.dump().substr(0, 300)));
    }
    p = &(*p)[key];
  }
  if (!p->is_string()) {
    return absl::InternalError(fmt::format("response field \"{}{}{}\" is not a string", a,
                                           b ? "." : "", b ? b : ""));
  }
  return p->get<std::string>();
}

bool WarmPoolFlag(const nlohmann::json& op) {
  if (!op.is_object() || !op.contains("result") || !op["result"].is_object()) return false;
  const auto& r = op["result"];
  return r.contains("warm_pool") && r["warm_pool"].is_boolean() && r["warm_pool"].get<bool>();
}

}  // namespace

std::optional<ChunkFields> ScanChunkEvent(std::string_view data) {
  constexpr std::string_view kData = "\"data_b64\":";
  constexpr std::string_view kOffset = "\"offset\":";
  ChunkFields f;
  size_t d = data.find(kData);
  if (d == std::string_view::npos) return std::nullopt;
  size_t q = data.find_first_not_of(' ', d + kData.size());
  if (q == std::string_view::npos || data[q] != '"') return std::nullopt;
  size_t end = data.find('"', q + 1);  // base64 never contains a quote or a backslash
  if (end == std::string_view::npos) return std::nullopt;
  f.data_b64 = data.substr(q + 1, end - q - 1);
  // sbxd writes the offset after the bytes: looked for there first, so the base64 (hundreds
  // of KiB) is scanned once.
  size_t o = data.find(kOffset, end + 1);
  if (o == std::string_view::npos) o = data.substr(0, d).find(kOffset);
  if (o == std::string_view::npos) return std::nullopt;
  size_t i = data.find_first_not_of(' ', o + kOffset.size());
  if (i == std::string_view::npos || data[i] < '0' || data[i] > '9') return std::nullopt;
  for (; i < data.size() && data[i] >= '0' && data[i] <= '9'; ++i) {
    f.offset = f.offset * 10 + static_cast<uint64_t>(data[i] - '0');
  }
  return f;
}

absl::StatusOr<Created> Api::CreateSandbox(const nlohmann::json& body) {
  SBX_ASSIGN_OR_RETURN(nlohmann::json res, conn_.Json("POST", "/v1/sandboxes", &body));
  Created c;
  SBX_ASSIGN_OR_RETURN(c.sandbox_id, StringField(res, "sandbox", "id"));
  SBX_ASSIGN_OR_RETURN(c.operation_id, StringField(res, "operation", "id"));
  c.warm_pool = WarmPoolFlag(res["operation"]);
  return c;
}

absl::StatusOr<nlohmann::json> Api::WaitOperation(const std::string& op_id) {
  const std::string target = fmt::format("/v1/operations/{}?wait_ms=30000", op_id);
  // Each request returns as soon as the operation ends, or after 30 s still running: a loop of
  // long polls, never a sleep.
  for (int i = 0; i < 10; ++i) {
    SBX_ASSIGN_OR_RETURN(nlohmann::json op, conn_.Json("GET", target));
    std::string state = op.value("state", "");
    if (state == "succeeded") return op;
    if (state == "failed") {
      return absl::InternalError(fmt::format("operation {} ({}) failed: {}", op_id,
                                             op.value("kind", "?"), op["error"].dump()));
    }
  }
  return absl::DeadlineExceededError(
      fmt::format("wait for operation {}: still not finished after 300 s", op_id));
}

absl::StatusOr<Created> Api::CreateRunning(const nlohmann::json& body) {
  SBX_ASSIGN_OR_RETURN(Created c, CreateSandbox(body));
  SBX_ASSIGN_OR_RETURN(nlohmann::json op, WaitOperation(c.operation_id));
  c.warm_pool = c.warm_pool || WarmPoolFlag(op);
  return c;
}

absl::StatusOr<std::string> Api::StartDelete(const std::string& sandbox_id) {
  SBX_ASSIGN_OR_RETURN(nlohmann::json res,
                       conn_.Json("DELETE", fmt::format("/v1/sandboxes/{}", sandbox_id)));
  return StringField(res, "operation", "id");
}

absl::Status Api::DeleteAndWait(const std::string& sandbox_id) {
  SBX_ASSIGN_OR_RETURN(std::string op, StartDelete(sandbox_id));
  return WaitOperation(op).status();
}

absl::StatusOr<Session> Api::CreateSession(const std::string& sandbox_id,
                                           const std::vector<std::string>& argv) {
  nlohmann::json body = {{"argv", argv}};
  SBX_ASSIGN_OR_RETURN(
      nlohmann::json res,
      conn_.Json("POST", fmt::format("/v1/sandboxes/{}/sessions", sandbox_id), &body));
  Session s;
  SBX_ASSIGN_OR_RETURN(s.id, StringField(res, "session_id"));
  SBX_ASSIGN_OR_RETURN(s.attach_url, StringField(res, "attach", "url"));
  SBX_ASSIGN_OR_RETURN(s.attach_token, StringField(res, "attach", "token"));
  return s;
}

Session Api::SessionToCreate(const std::string& sandbox_id,
                             const std::vector<std::string>& argv) {
  Session s;
  s.id = "(new session)";
  s.attach_url = fmt::format("/v1/sandboxes/{}/sessions?attach=true", sandbox_id);
  s.attach_token = conn_.token();
  s.create_body = nlohmann::json{{"argv", argv}}.dump();
  return s;
}

absl::StatusOr<AttachResult> Api::Attach(const Session& session) {
  AttachResult out;
  bool exited = false;
  std::string decoded;
  absl::Status st = conn_.Stream(
      session.attach_url, session.attach_token,
      [&](const cli::SseEvent& ev) -> absl::StatusOr<bool> {
        if (ev.type == "stdout") {
          if (!out.first_stdout) out.first_stdout = Clock::now();
          std::optional<ChunkFields> d = ScanChunkEvent(ev.data);
          if (!d) {
            return absl::InternalError(
                fmt::format("{}: malformed stdout event {}", session.id, ev.data.substr(0, 200)));
          }
          uint64_t offset = d->offset;
          if (offset != out.stdout_bytes) {
            return absl::DataLossError(fmt::format(
                "{}: stdout event {} has offset {}, expected {} (gap or duplicate)", session.id,
                ev.id, offset, out.stdout_bytes));
          }
          // One buffer for the whole stream: events run to hundreds of KiB.
          if (!Base64DecodeTo(d->data_b64, decoded)) {
            return absl::InternalError(
                fmt::format("{}: stdout event {} has invalid base64", session.id, ev.id));
          }
          out.stdout_bytes += decoded.size();
          if (out.stdout_head.size() < AttachResult::kHeadBytes) {
            out.stdout_head.append(std::string_view(decoded).substr(
                0, AttachResult::kHeadBytes - out.stdout_head.size()));
          }
        } else if (ev.type == "process_exited") {
          out.exited = Clock::now();
          out.exit = nlohmann::json::parse(ev.data, nullptr, false);
          exited = true;
        } else if (ev.type == "error") {
          return absl::InternalError(
              fmt::format("{}: error event: {}", session.id, ev.data.substr(0, 300)));
        } else if (ev.type == "resync_required") {
          return absl::DataLossError(
              fmt::format("{}: resync_required on a first attach: {}", session.id, ev.data));
        }
        return true;  // read on to the end of the response, so the connection stays reusable
      },
      session.create_body);
  SBX_RETURN_IF_ERROR(st);
  if (!exited) {
    return absl::InternalError(
        fmt::format("attach {}: the stream ended without process_exited", session.id));
  }
  return out;
}

absl::StatusOr<AttachResult> Api::AttachBinary(const Session& session) {
  AttachResult out;
  bool exited = false;
  // The frame being read: its 24-byte header, then `left` payload bytes.
  unsigned char header[24];
  size_t have = 0;
  uint8_t kind = 0;
  uint64_t id = 0, offset = 0, left = 0, last_id = 0;
  std::string control;  // a control frame's JSON
  auto be = [&](int at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | header[at + i];
    return v;
  };
  auto finish = [&]() -> absl::Status {  // a whole frame has been read
    if (kind == 5) {
      out.exited = Clock::now();
      out.exit = nlohmann::json::parse(control, nullptr, false);
      exited = true;
    } else if (kind == 4) {
      return absl::InternalError(fmt::format("{}: error frame: {}", session.id, control.substr(0, 300)));
    } else if (kind == 3) {
      return absl::DataLossError(
          fmt::format("{}: resync_required on a first attach: {}", session.id, control));
    }
    return absl::OkStatus();
  };
  const char* sep = session.attach_url.find('?') == std::string::npos ? "?" : "&";
  absl::Status st = conn_.StreamBytes(
      session.attach_url + sep + "format=binary", session.attach_token,
      "application/vnd.sbx.attach+binary", [&](std::string_view bytes) -> absl::StatusOr<bool> {
        while (!bytes.empty()) {
          if (have < sizeof(header)) {
            const size_t n = std::min(bytes.size(), sizeof(header) - have);
            std::memcpy(header + have, bytes.data(), n);
            have += n;
            bytes.remove_prefix(n);
            if (have < sizeof(header)) break;
            kind = header[0];
            left = be(4, 4);
            id = be(8, 8);
            offset = be(16, 8);
            if (kind > 5 || header[1] || header[2] || header[3]) {
              return absl::InternalError(fmt::format("{}: malformed frame header", session.id));
            }
            if (id != 0) {
              if (last_id != 0 && id != last_id + 1) {
                return absl::DataLossError(fmt::format(
                    "{}: frame id {} after {} (gap or duplicate)", session.id, id, last_id));
              }
              last_id = id;
            }
            if (kind == 1) {
              if (!out.first_stdout) out.first_stdout = Clock::now();
              if (offset != out.stdout_bytes) {
                return absl::DataLossError(fmt::format(
                    "{}: stdout frame {} has offset {}, expected {} (gap or duplicate)",
                    session.id, id, offset, out.stdout_bytes));
              }
            }
            control.clear();
          }
          const size_t n = static_cast<size_t>(std::min<uint64_t>(left, bytes.size()));
          const std::string_view piece = bytes.substr(0, n);
          if (kind == 1) {
            out.stdout_bytes += n;
            if (out.stdout_head.size() < AttachResult::kHeadBytes) {
              out.stdout_head.append(piece.substr(
                  0, AttachResult::kHeadBytes - out.stdout_head.size()));
            }
          } else if (kind >= 3) {
            if (control.size() + n > (64u << 10)) {
              return absl::InternalError(fmt::format("{}: control frame too large", session.id));
            }
            control.append(piece);
          }
          left -= n;
          bytes.remove_prefix(n);
          if (left == 0) {
            have = 0;
            SBX_RETURN_IF_ERROR(finish());
          }
        }
        return true;  // read on to the end of the response, so the connection stays reusable
      },
      session.create_body);
  SBX_RETURN_IF_ERROR(st);
  if (!exited) {
    return absl::InternalError(
        fmt::format("attach {}: the stream ended without process_exited", session.id));
  }
  return out;
}

absl::StatusOr<AttachResult> Api::Exec(const std::string& sandbox_id,
                                       const std::vector<std::string>& argv, bool binary,
                                       ExecForm form) {
  Session s;
  if (form == ExecForm::kOneRequest) {
    s = SessionToCreate(sandbox_id, argv);
  } else {
    SBX_ASSIGN_OR_RETURN(s, CreateSession(sandbox_id, argv));
  }
  SBX_ASSIGN_OR_RETURN(AttachResult r, binary ? AttachBinary(s) : Attach(s));
  if (!r.exit.is_object() || r.exit.value("exit_code", nlohmann::json()) != 0) {
    return absl::InternalError(
        fmt::format("{} in {}: process exited with {}", argv.front(), sandbox_id, r.exit.dump()));
  }
  return r;
}

}  // namespace sbx::load
