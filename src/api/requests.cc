#include "api/requests.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>

#include "common/base64.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "service/agent_types.h"

namespace sbx::api {
namespace {

using Json = nlohmann::json;

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

absl::StatusOr<Json> ParseObject(std::string_view body, bool empty_ok,
                                 std::string_view what = "request body") {
  if (body.empty() && empty_ok) return Json::object();
  auto parsed = ParseUntrustedJson(body, kMaxRequestJsonDepth);
  if (!parsed.ok() && IsJsonTooDeep(parsed.status())) {
    return WithDetail(
        ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                 fmt::format("{} is not valid JSON: it nests deeper than {} levels", what,
                             kMaxRequestJsonDepth)),
        kJsonTooDeepDetail, "1");
  }
  if (!parsed.ok()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    fmt::format("{} is not valid JSON", what));
  }
  Json j = std::move(*parsed);
  if (!j.is_object()) {
    return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    fmt::format("{} must be a JSON object, got {}", what, TypeName(j)));
  }
  return j;
}

// Whether an optional field was given: the contract's convention is that null means the same
// as leaving the field out (docs/api/openapi.yaml marks every optional field nullable), so a
// client that serializes its unset fields as null is answered as if it had omitted them.
bool Given(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  return it != obj.end() && !it->is_null();
}

absl::Status CheckKnown(const Json& obj, std::initializer_list<const char*> known,
                        const std::string& prefix) {
  for (const auto& [key, value] : obj.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) return FieldError(prefix + key, "unknown field");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GetString(const Json& v, const std::string& field, size_t max_len) {
  if (!v.is_string()) {
    return FieldError(field, fmt::format("must be a string, got {}", TypeName(v)));
  }
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_len) {
    return FieldError(field, fmt::format("must be at most {} bytes", max_len));
  }
  if (s.find('\0') != std::string::npos) return FieldError(field, "must not contain NUL bytes");
  return s;
}

absl::StatusOr<int64_t> GetInt(const Json& v, const std::string& field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) {
    return FieldError(field, fmt::format("must be an integer, got {}", TypeName(v)));
  }
  int64_t x;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(field, fmt::format("must be between {} and {}", lo, hi));
    }
    x = static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) return FieldError(field, fmt::format("must be between {} and {}", lo, hi));
  return x;
}

absl::StatusOr<bool> GetBool(const Json& v, const std::string& field) {
  if (!v.is_boolean()) {
    return FieldError(field, fmt::format("must be a boolean, got {}", TypeName(v)));
  }
  return v.get<bool>();
}

bool IsEnvName(const std::string& k) {
  if (k.empty() || k.size() > 255) return false;
  if (!(std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_')) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

bool IsLabelKey(const std::string& k) {
  if (k.empty() || k.size() > 63) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '/' ||
          c == '-')) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::map<std::string, std::string>> GetEnv(const Json& v,
                                                          const std::string& field) {
  if (!v.is_object()) {
    return FieldError(field, fmt::format("must be an object, got {}", TypeName(v)));
  }
  if (v.size() > 256) return FieldError(field, "at most 256 variables");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.items()) {
    if (!IsEnvName(k)) {
      return FieldError(field + "." + k, "variable names match [A-Za-z_][A-Za-z0-9_]*");
    }
    SBX_ASSIGN_OR_RETURN(out[k], GetString(val, field + "." + k, 32 << 10));
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> GetLabels(const Json& v,
                                                             const std::string& field) {
  if (!v.is_object()) {
    return FieldError(field, fmt::format("must be an object, got {}", TypeName(v)));
  }
  if (v.size() > 64) return FieldError(field, "at most 64 labels");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.items()) {
    if (!IsLabelKey(k)) {
      return FieldError(field + "." + k, "label keys are 1-63 characters of [A-Za-z0-9._/-]");
    }
    SBX_ASSIGN_OR_RETURN(out[k], GetString(val, field + "." + k, 255));
  }
  return out;
}

}  // namespace

absl::StatusOr<CreateSandboxRequest> ParseCreateSandbox(const std::string& body,
                                                        const ResourceLimits& limits) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/true));
  SBX_RETURN_IF_ERROR(CheckKnown(j,
                                 {"template", "resources", "egress_profile", "egress", "env", "labels",
                                  "runtime", "timeout_s", "idle_suspend_s", "public_ports",
                                  "placement"},
                                 ""));
  CreateSandboxRequest r;
  if (Given(j, "template")) {
    SBX_ASSIGN_OR_RETURN(r.template_ref, GetString(j["template"], "template", 255));
    if (r.template_ref.empty()) return FieldError("template", "must not be empty");
  }
  if (Given(j, "resources")) {
    const Json& res = j["resources"];
    if (!res.is_object()) {
      return FieldError("resources", fmt::format("must be an object, got {}", TypeName(res)));
    }
    // The requestable resources, each within its limits; an absent or null one gets the
    // deployment's default later (service).
    const struct {
      const char* key;
      int64_t min, max;
      std::optional<int64_t> CreateSandboxRequest::*field;
    } requestable[] = {
        {"vcpu", limits.min_vcpu, limits.max_vcpu, &CreateSandboxRequest::vcpu},
        {"memory_mib", limits.min_memory_mib, limits.max_memory_mib,
         &CreateSandboxRequest::memory_mib},
        {"disk_mib", limits.min_disk_mib, limits.max_disk_mib, &CreateSandboxRequest::disk_mib},
    };
    SBX_RETURN_IF_ERROR(CheckKnown(res, {"vcpu", "memory_mib", "disk_mib"}, "resources."));
    for (const auto& q : requestable) {
      if (!res.contains(q.key) || res[q.key].is_null()) continue;
      SBX_ASSIGN_OR_RETURN(r.*q.field,
                           GetInt(res[q.key], fmt::format("resources.{}", q.key), q.min, q.max));
    }
  }
  if (Given(j, "egress_profile")) {
    SBX_ASSIGN_OR_RETURN(r.egress_profile, GetString(j["egress_profile"], "egress_profile", 63));
  }
  // Resolved against the deployment's profiles by the service (which knows them); only the
  // shape is checked here.
  if (Given(j, "egress")) {
    if (!j["egress"].is_object()) {
      return FieldError("egress", fmt::format("must be an object ({{\"allow\": [rules]}}), got {}",
                                              TypeName(j["egress"])));
    }
    r.egress = j["egress"];
  }
  if (Given(j, "env")) {
    SBX_ASSIGN_OR_RETURN(r.env, GetEnv(j["env"], "env"));
  }
  if (Given(j, "labels")) {
    SBX_ASSIGN_OR_RETURN(r.labels, GetLabels(j["labels"], "labels"));
  }
  if (Given(j, "runtime")) {
    SBX_ASSIGN_OR_RETURN(std::string rt, GetString(j["runtime"], "runtime", 32));
    r.runtime = rt;
  }
  if (Given(j, "timeout_s")) {
    SBX_ASSIGN_OR_RETURN(r.timeout_s, GetInt(j["timeout_s"], "timeout_s", 1, 30LL * 86400));
  }
  if (Given(j, "idle_suspend_s")) {
    SBX_ASSIGN_OR_RETURN(r.idle_suspend_s,
                         GetInt(j["idle_suspend_s"], "idle_suspend_s", 0, 30LL * 86400));
  }
  if (Given(j, "public_ports")) {
    if (!j["public_ports"].is_boolean()) {
      return FieldError("public_ports",
                        fmt::format("must be a boolean, got {}", TypeName(j["public_ports"])));
    }
    r.public_ports = j["public_ports"].get<bool>();
  }
  if (Given(j, "placement")) {
    const Json& pl = j["placement"];
    if (!pl.is_object()) {
      return FieldError("placement", fmt::format("must be an object, got {}", TypeName(pl)));
    }
    SBX_RETURN_IF_ERROR(CheckKnown(pl, {"anti_affinity"}, "placement."));
    if (Given(pl, "anti_affinity")) {
      SBX_ASSIGN_OR_RETURN(std::string key,
                           GetString(pl["anti_affinity"], "placement.anti_affinity", 63));
      // Spreading by a value the sandbox does not have would spread it by nothing.
      if (!r.labels.contains(key)) {
        return FieldError("placement.anti_affinity",
                          fmt::format("'{}' is not a key of this create's labels", key));
      }
      r.anti_affinity = std::move(key);
    }
  }
  r.canonical = std::move(j);
  return r;
}

absl::Status ParseLifecycleBody(const std::string& body) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/true));
  return CheckKnown(j, {}, "");
}

absl::StatusOr<nlohmann::json> ParseEgressPatch(const std::string& body) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/false));
  SBX_RETURN_IF_ERROR(CheckKnown(j, {"allow"}, ""));
  if (!j.contains("allow")) return FieldError("allow", "required: the sandbox's new allow rules");
  return j;
}

namespace {

absl::StatusOr<std::string> GetName(const Json& v, const std::string& field) {
  SBX_ASSIGN_OR_RETURN(std::string n, GetString(v, field, 128));
  if (n.empty()) return FieldError(field, "must not be empty");
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
          c == ' ')) {
      return FieldError(field, "letters, digits, ' ', '.', '_' and '-' only");
    }
  }
  return n;
}

}  // namespace

absl::StatusOr<service::TenantSpec> ParseTenantSpec(const std::string& body, bool create) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/!create));
  SBX_RETURN_IF_ERROR(CheckKnown(j, {"name", "quotas", "rate_limit", "egress_profiles"}, ""));
  service::TenantSpec out;
  if (Given(j, "name")) {
    SBX_ASSIGN_OR_RETURN(out.name, GetName(j["name"], "name"));
  } else if (create) {
    return FieldError("name", "is required");
  }
  if (Given(j, "quotas")) {
    const Json& q = j["quotas"];
    if (!q.is_object()) return FieldError("quotas", "must be an object");
    SBX_RETURN_IF_ERROR(CheckKnown(q, {"max_sandboxes", "max_vcpu", "max_memory_mib",
                                       "max_disk_mib", "max_sessions_per_sandbox",
                                       "max_templates", "max_template_bytes"},
                                   "quotas."));
    Json checked = Json::object();
    for (const auto& [k, v] : q.items()) {
      if (v.is_null()) continue;  // left out
      SBX_ASSIGN_OR_RETURN(checked[k], GetInt(v, "quotas." + k, 0, int64_t{1} << 53));
    }
    out.quotas = std::move(checked);
  }
  if (Given(j, "rate_limit")) {
    const Json& r = j["rate_limit"];
    if (!r.is_object()) return FieldError("rate_limit", "must be an object");
    SBX_RETURN_IF_ERROR(CheckKnown(r, {"requests_per_s", "burst"}, "rate_limit."));
    Json checked = Json::object();
    if (Given(r, "requests_per_s")) {
      const Json& v = r["requests_per_s"];
      if (!v.is_number() || v.get<double>() <= 0 || v.get<double>() > 1e6) {
        return FieldError("rate_limit.requests_per_s", "must be a number above 0, at most 1e6");
      }
      checked["requests_per_s"] = v.get<double>();
      if (Given(r, "burst")) {
        SBX_ASSIGN_OR_RETURN(checked["burst"], GetInt(r["burst"], "rate_limit.burst", 1, 1000000));
      }
    } else if (Given(r, "burst")) {
      return FieldError("rate_limit.burst", "needs rate_limit.requests_per_s");
    }
    out.rate_limit = std::move(checked);
  }
  if (j.contains("egress_profiles")) {
    // null: every profile of the deployment; a list: those (and `none`). A name the deployment
    // lacks is accepted (profiles come and go with its configuration) and matches nothing.
    const Json& e = j["egress_profiles"];
    if (!e.is_null() && !e.is_array()) {
      return FieldError("egress_profiles", "must be an array of profile names, or null for all");
    }
    if (e.is_array() && e.size() > 256) return FieldError("egress_profiles", "at most 256 names");
    Json checked = e.is_null() ? Json(nullptr) : Json::array();
    for (size_t i = 0; e.is_array() && i < e.size(); ++i) {
      const std::string f = fmt::format("egress_profiles[{}]", i);
      SBX_ASSIGN_OR_RETURN(std::string n, GetString(e[i], f, 63));
      if (n.empty() || n.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") !=
                           std::string::npos) {
        return FieldError(f, "a profile name is 1-63 of a-z, 0-9 and '_'");
      }
      if (std::find(checked.begin(), checked.end(), n) == checked.end()) checked.push_back(n);
    }
    out.egress_profiles = std::move(checked);
  }
  return out;
}

absl::StatusOr<service::TokenSpec> ParseTokenSpec(const std::string& body) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/false));
  SBX_RETURN_IF_ERROR(CheckKnown(j, {"name", "scopes", "expires_in_s"}, ""));
  service::TokenSpec out;
  if (!j.contains("name")) return FieldError("name", "is required");
  SBX_ASSIGN_OR_RETURN(out.name, GetName(j["name"], "name"));
  if (!j.contains("scopes")) return FieldError("scopes", "is required");
  const Json& sc = j["scopes"];
  if (!sc.is_array() || sc.empty() || sc.size() > 16) {
    return FieldError("scopes", "must be a non-empty array of scope names");
  }
  for (size_t i = 0; i < sc.size(); ++i) {
    SBX_ASSIGN_OR_RETURN(std::string name, GetString(sc[i], fmt::format("scopes[{}]", i), 32));
    out.scopes.push_back(std::move(name));
  }
  if (Given(j, "expires_in_s")) {
    SBX_ASSIGN_OR_RETURN(out.expires_in_s,
                         GetInt(j["expires_in_s"], "expires_in_s", 1, int64_t{10} * 366 * 86400));
  }
  return out;
}

absl::StatusOr<CreateSessionRequest> ParseCreateSession(const std::string& body) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/false));
  SBX_RETURN_IF_ERROR(
      CheckKnown(j, {"argv", "cwd", "env", "user", "tty", "stdin", "timeout_s", "kill_grace_s"},
                 ""));
  CreateSessionRequest r;
  if (!j.contains("argv")) return FieldError("argv", "is required");
  const Json& argv = j["argv"];
  if (!argv.is_array()) {
    return FieldError("argv", fmt::format("must be an array of strings, got {}", TypeName(argv)));
  }
  if (argv.empty()) return FieldError("argv", "must not be empty");
  if (argv.size() > 4096) return FieldError("argv", "at most 4096 arguments");
  size_t total = 0;
  for (size_t i = 0; i < argv.size(); ++i) {
    SBX_ASSIGN_OR_RETURN(std::string a, GetString(argv[i], fmt::format("argv[{}]", i), 128 << 10));
    total += a.size();
    r.argv.push_back(std::move(a));
  }
  if (r.argv[0].empty()) return FieldError("argv[0]", "must not be empty");
  if (total > (512 << 10)) return FieldError("argv", "at most 512 KiB in total");
  if (Given(j, "cwd")) {
    SBX_ASSIGN_OR_RETURN(std::string cwd, GetString(j["cwd"], "cwd", 4096));
    if (cwd.empty() || cwd[0] != '/') return FieldError("cwd", "must be an absolute path");
    r.cwd = cwd;
  }
  if (Given(j, "env")) {
    SBX_ASSIGN_OR_RETURN(r.env, GetEnv(j["env"], "env"));
  }
  if (Given(j, "user")) {
    SBX_ASSIGN_OR_RETURN(std::string user, GetString(j["user"], "user", 32));
    if (user.empty()) return FieldError("user", "must not be empty");
    for (char c : user) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
        return FieldError("user", "must be a user name or a numeric uid");
      }
    }
    r.user = user;
  }
  if (Given(j, "tty")) {
    const Json& tty = j["tty"];
    if (tty.is_object()) {
      // {"rows","cols"}: a terminal of that size (each defaults to 24x80's).
      SBX_RETURN_IF_ERROR(CheckKnown(tty, {"rows", "cols"}, "tty."));
      r.tty = true;
      if (Given(tty, "rows")) {
        SBX_ASSIGN_OR_RETURN(int64_t v, GetInt(tty["rows"], "tty.rows", 1, 1000));
        r.tty_rows = static_cast<int>(v);
      }
      if (Given(tty, "cols")) {
        SBX_ASSIGN_OR_RETURN(int64_t v, GetInt(tty["cols"], "tty.cols", 1, 1000));
        r.tty_cols = static_cast<int>(v);
      }
    } else {
      SBX_ASSIGN_OR_RETURN(r.tty, GetBool(tty, "tty"));
    }
  }
  if (Given(j, "stdin")) {
    SBX_ASSIGN_OR_RETURN(r.stdin_open, GetBool(j["stdin"], "stdin"));
  }
  if (Given(j, "timeout_s")) {
    SBX_ASSIGN_OR_RETURN(r.timeout_s, GetInt(j["timeout_s"], "timeout_s", 1, 30LL * 86400));
  }
  if (Given(j, "kill_grace_s")) {
    SBX_ASSIGN_OR_RETURN(r.kill_grace_s, GetInt(j["kill_grace_s"], "kill_grace_s", 0, 300));
    if (!r.timeout_s) return FieldError("kill_grace_s", "is only valid with timeout_s");
  }
  r.canonical = std::move(j);
  return r;
}

absl::StatusOr<int> ParseLimit(const std::optional<std::string>& value) {
  if (!value) return 50;
  int v = 0;
  auto [p, ec] = std::from_chars(value->data(), value->data() + value->size(), v);
  if (ec != std::errc() || p != value->data() + value->size() || v < 1 || v > 500) {
    return FieldError("limit", "must be an integer between 1 and 500");
  }
  return v;
}

absl::StatusOr<int> ParseWaitMs(const std::optional<std::string>& value) {
  if (!value) return 0;
  int v = 0;
  auto [p, ec] = std::from_chars(value->data(), value->data() + value->size(), v);
  if (ec != std::errc() || p != value->data() + value->size() || v < 0 || v > kMaxWaitMs) {
    return FieldError("wait_ms", fmt::format("must be an integer between 0 and {}", kMaxWaitMs));
  }
  return v;
}

absl::StatusOr<std::pair<std::string, std::string>> ParseLabelFilter(const std::string& value) {
  auto eq = value.find('=');
  if (eq == std::string::npos || eq == 0) return FieldError("label", "must be key=value");
  std::string key = value.substr(0, eq);
  if (!IsLabelKey(key)) return FieldError("label", "label keys are 1-63 characters of [A-Za-z0-9._/-]");
  return std::make_pair(key, value.substr(eq + 1));
}

absl::Status ValidateIdempotencyKey(const std::string& key) {
  if (key.empty() || key.size() > 255) {
    return FieldError("Idempotency-Key", "must be 1-255 printable ASCII characters");
  }
  for (char c : key) {
    if (c < 0x20 || c > 0x7e) {
      return FieldError("Idempotency-Key", "must be 1-255 printable ASCII characters");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseLastEventId(const std::string& value) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || p != value.data() + value.size()) {
    return FieldError("Last-Event-ID", "must be a non-negative integer");
  }
  return v;
}

absl::StatusOr<std::string> ParseStdinBody(const std::string& body, bool json_body) {
  auto too_large = [](size_t n) {
    return ApiError(absl::StatusCode::kInvalidArgument, "payload_too_large",
                    fmt::format("stdin data is {} bytes; at most {} per request", n,
                                kMaxStdinBytes),
                    "data");
  };
  if (!json_body) {
    if (body.size() > kMaxStdinBytes) return too_large(body.size());
    return body;
  }
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/false));
  SBX_RETURN_IF_ERROR(CheckKnown(j, {"data", "data_b64"}, ""));
  const bool text = Given(j, "data"), b64 = Given(j, "data_b64");
  if (text == b64) return FieldError("data", "exactly one of data and data_b64 is required");
  std::string out;
  if (text) {
    SBX_ASSIGN_OR_RETURN(out, GetString(j["data"], "data", SIZE_MAX));
  } else {
    SBX_ASSIGN_OR_RETURN(std::string enc, GetString(j["data_b64"], "data_b64", SIZE_MAX));
    auto dec = Base64Decode(enc);
    if (!dec) return FieldError("data_b64", "is not valid base64 (standard alphabet, padded)");
    out = std::move(*dec);
  }
  if (out.size() > kMaxStdinBytes) return too_large(out.size());
  return out;
}

absl::StatusOr<int> ParseSignalBody(const std::string& body) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/false));
  return ParseSignalObject(j);
}

absl::StatusOr<int> ParseSignalObject(const Json& j) {
  SBX_RETURN_IF_ERROR(CheckKnown(j, {"signal"}, ""));
  if (!j.contains("signal")) return FieldError("signal", "is required");
  const Json& v = j["signal"];
  std::optional<int> signo;
  if (v.is_number_integer()) {
    // Only numbers that have a name here: the same set as the names, whatever the platform.
    const int64_t n = v.get<int64_t>();
    if (n >= 1 && n <= 64 && service::SignalName(static_cast<int>(n))) signo = static_cast<int>(n);
  } else if (v.is_string()) {
    signo = service::SignalNumber(v.get<std::string>());
  } else {
    return FieldError("signal",
                      fmt::format("must be a signal name or number, got {}", TypeName(v)));
  }
  if (!signo) {
    // v is a number or a string here, never a tree; a long string is cut, since the message
    // goes back to the client and into the log.
    std::string shown = v.dump(-1, ' ', false, Json::error_handler_t::replace);
    if (shown.size() > 40) shown = shown.substr(0, 36) + "...\"";
    return FieldError("signal", fmt::format("unknown signal {} (use a name like \"TERM\", "
                                            "\"SIGINT\", \"KILL\", \"HUP\")",
                                            shown));
  }
  return *signo;
}

absl::StatusOr<std::pair<int, int>> ParseResizeBody(const std::string& body) {
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(body, /*empty_ok=*/false));
  return ParseResizeObject(j);
}

absl::StatusOr<std::pair<int, int>> ParseResizeObject(const Json& j) {
  SBX_RETURN_IF_ERROR(CheckKnown(j, {"rows", "cols"}, ""));
  if (!j.contains("rows")) return FieldError("rows", "is required");
  if (!j.contains("cols")) return FieldError("cols", "is required");
  SBX_ASSIGN_OR_RETURN(int64_t rows, GetInt(j["rows"], "rows", 1, 1000));
  SBX_ASSIGN_OR_RETURN(int64_t cols, GetInt(j["cols"], "cols", 1, 1000));
  return std::make_pair(static_cast<int>(rows), static_cast<int>(cols));
}

absl::StatusOr<WsControl> ParseWsControl(std::string_view text) {
  SBX_ASSIGN_OR_RETURN(Json m, ParseObject(text, /*empty_ok=*/false, "control message"));
  auto type = m.find("type");
  if (type == m.end() || !type->is_string()) {
    return FieldError("type", "a control message needs a string \"type\"");
  }
  WsControl c;
  const std::string t = type->get<std::string>();
  // The other fields are checked as the HTTP route's body would be: the same parser on the
  // object without "type" (an erase: no copy of what the client sent).
  m.erase(type);
  if (t == "resize") {
    c.type = WsControl::Type::kResize;
    SBX_ASSIGN_OR_RETURN(auto size, ParseResizeObject(m));
    c.rows = size.first;
    c.cols = size.second;
  } else if (t == "signal") {
    c.type = WsControl::Type::kSignal;
    SBX_ASSIGN_OR_RETURN(c.signal, ParseSignalObject(m));
  } else if (t == "stdin_close") {
    c.type = WsControl::Type::kStdinClose;
  } else {
    return FieldError("type", fmt::format("unknown control message type \"{}\"", t.substr(0, 64)));
  }
  return c;
}

}  // namespace sbx::api
