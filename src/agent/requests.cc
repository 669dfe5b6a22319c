#include "agent/requests.h"

#include <signal.h>

#include <optional>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::agent {
namespace {

using protocol::Json;

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

// Standard padded base64. The agent cannot use common/encoding.cc: its object also holds the
// OpenSSL-based digests, which the static binary does not link.
std::optional<std::string> DecodeBase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      if (in[i + k] == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after padding
      v[k] = value(in[i + k]);
      if (v[k] < 0) return std::nullopt;
    }
    const uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return out;
}

absl::Status ParseArgv(const Json& spec, SpawnSpec& ss) {
  auto argv = spec.find("argv");
  if (argv == spec.end() || !argv->is_array() || argv->empty()) {
    return absl::InvalidArgumentError("spec.argv must be a non-empty array of strings");
  }
  for (const auto& a : *argv) {
    if (!a.is_string() || HasNul(a.get_ref<const std::string&>())) {
      return absl::InvalidArgumentError("spec.argv must hold strings without NUL bytes");
    }
    ss.argv.push_back(a.get<std::string>());
  }
  if (ss.argv[0].empty()) return absl::InvalidArgumentError("spec.argv[0] is empty");
  return absl::OkStatus();
}

absl::Status ParseEnv(const Json& spec, std::map<std::string, std::string>& env) {
  auto e = spec.find("env");
  if (e == spec.end() || e->is_null()) return absl::OkStatus();
  if (!e->is_object()) return absl::InvalidArgumentError("spec.env must be an object");
  for (const auto& [k, v] : e->items()) {
    if (k.empty() || k.find('=') != std::string::npos || HasNul(k) || !v.is_string() ||
        HasNul(v.get_ref<const std::string&>())) {
      return absl::InvalidArgumentError(fmt::format(
          "spec.env[\"{}\"]: keys must be non-empty without '=' and values strings", k));
    }
    env[k] = v.get<std::string>();
  }
  return absl::OkStatus();
}

// Interactive options (see protocol.h). "tty" is true or {"rows","cols"}.
absl::Status ParseTty(const Json& spec, SpawnSpec& ss) {
  auto t = spec.find("tty");
  if (t == spec.end() || t->is_null()) return absl::OkStatus();
  if (t->is_boolean()) {
    ss.tty = t->get<bool>();
  } else if (t->is_object()) {
    ss.tty = true;
    for (const char* key : {"rows", "cols"}) {
      auto v = t->find(key);
      if (v == t->end()) continue;
      if (!v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > 65535) {
        return absl::InvalidArgumentError(
            fmt::format("spec.tty.{} must be an integer from 1 to 65535", key));
      }
      (std::string_view(key) == "rows" ? ss.rows : ss.cols) =
          static_cast<unsigned short>(v->get<uint64_t>());
    }
  } else {
    return absl::InvalidArgumentError("spec.tty must be a boolean or {\"rows\",\"cols\"}");
  }
  return absl::OkStatus();
}

absl::Status ParseLimits(const Json& spec, SessionSpec& out) {
  if (auto t = spec.find("timeout_s"); t != spec.end() && !t->is_null()) {
    if (!t->is_number_unsigned() || t->get<uint64_t>() < 1 ||
        t->get<uint64_t>() > static_cast<uint64_t>(kMaxTimeoutS)) {
      return absl::InvalidArgumentError(
          fmt::format("spec.timeout_s must be an integer from 1 to {}", kMaxTimeoutS));
    }
    out.timeout_s = t->get<int64_t>();
  }
  if (auto g = spec.find("kill_grace_s"); g != spec.end() && !g->is_null()) {
    if (!g->is_number_unsigned() || g->get<uint64_t>() > kMaxKillGraceS) {
      return absl::InvalidArgumentError(
          fmt::format("spec.kill_grace_s must be an integer from 0 to {}", kMaxKillGraceS));
    }
    out.kill_grace_s = g->get<int>();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttachRequest> ParseAttachRequest(const Json& req) {
  AttachRequest r;
  auto sid = req.find("session_id");
  if (sid == req.end() || !sid->is_string() || sid->get_ref<const std::string&>().empty() ||
      sid->get_ref<const std::string&>().size() > kMaxSessionIdLength) {
    return absl::InvalidArgumentError("attach: session_id must be a non-empty string");
  }
  r.session_id = sid->get<std::string>();
  if (auto a = req.find("after_event_id"); a != req.end() && !a->is_null()) {
    if (!a->is_number_unsigned()) {
      return absl::InvalidArgumentError("attach: after_event_id must be a non-negative integer");
    }
    r.after_event_id = a->get<uint64_t>();
  }
  if (auto spec = req.find("spec"); spec != req.end() && !spec->is_null()) r.spec = &*spec;
  return r;
}

absl::StatusOr<SessionSpec> ParseSessionSpec(const Json& spec) {
  if (!spec.is_object()) {
    return absl::InvalidArgumentError("spec must be an object");
  }
  SessionSpec out;
  SpawnSpec& ss = out.spawn;
  SBX_RETURN_IF_ERROR(ParseArgv(spec, ss));
  if (auto cwd = spec.find("cwd"); cwd != spec.end() && !cwd->is_null()) {
    if (!cwd->is_string() || HasNul(cwd->get_ref<const std::string&>())) {
      return absl::InvalidArgumentError("spec.cwd must be a string");
    }
    // SpawnSpec's default "/" stays for an empty cwd.
    if (!cwd->get_ref<const std::string&>().empty()) ss.cwd = cwd->get<std::string>();
  }
  SBX_RETURN_IF_ERROR(ParseEnv(spec, out.env));
  SBX_RETURN_IF_ERROR(ParseTty(spec, ss));
  if (auto in = spec.find("stdin"); in != spec.end() && !in->is_null()) {
    if (!in->is_boolean()) return absl::InvalidArgumentError("spec.stdin must be a boolean");
    ss.stdin_pipe = in->get<bool>();
  }
  SBX_RETURN_IF_ERROR(ParseLimits(spec, out));
  if (auto u = spec.find("user"); u != spec.end() && !u->is_null()) {
    if (!u->is_string()) return absl::InvalidArgumentError("spec.user must be a string");
    out.user = u->get<std::string>();
  }
  return out;
}

absl::StatusOr<std::string> ParseSessionId(const Json& req, std::string_view op) {
  auto sid = req.find("session_id");
  if (sid == req.end() || !sid->is_string()) {
    return absl::InvalidArgumentError(fmt::format("{}: session_id must be a string", op));
  }
  return sid->get<std::string>();
}

absl::StatusOr<SignalRequest> ParseSignalRequest(const Json& req) {
  SignalRequest r;
  SBX_ASSIGN_OR_RETURN(r.session_id, ParseSessionId(req, "signal"));
  auto sj = req.find("signal");
  if (sj != req.end() && sj->is_number_integer()) {
    const int64_t v = sj->get<int64_t>();
    if (v >= 1 && v <= SIGRTMAX) r.signal = static_cast<int>(v);
  } else if (sj != req.end() && sj->is_string()) {
    r.signal = protocol::SignalNumber(sj->get<std::string>()).value_or(0);
  }
  if (r.signal == 0) {
    return absl::InvalidArgumentError("signal: \"signal\" must be a signal number (1-64) or name");
  }
  return r;
}

absl::StatusOr<std::string> ParseStdinData(const Json& req) {
  auto d = req.find("data_b64");
  if (d == req.end() || !d->is_string()) {
    return absl::InvalidArgumentError("stdin: data_b64 must be a base64 string");
  }
  auto decoded = DecodeBase64(d->get_ref<const std::string&>());
  if (!decoded) return absl::InvalidArgumentError("stdin: data_b64 is not base64");
  return std::move(*decoded);
}

absl::StatusOr<WindowSize> ParseResizeSize(const Json& req) {
  WindowSize ws;
  for (const char* key : {"rows", "cols"}) {
    auto v = req.find(key);
    if (v == req.end() || !v->is_number_unsigned() || v->get<uint64_t>() < 1 ||
        v->get<uint64_t>() > 65535) {
      return absl::InvalidArgumentError(
          fmt::format("resize: \"{}\" must be an integer from 1 to 65535", key));
    }
    (std::string_view(key) == "rows" ? ws.rows : ws.cols) =
        static_cast<unsigned short>(v->get<uint64_t>());
  }
  return ws;
}

}  // namespace sbx::agent
