#include "api/e2b/connect.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/json_util.h"
#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

namespace bhttp = http::bhttp;
using nlohmann::json;

struct CodeRow {
  Code code;
  std::string_view name;
  unsigned http;
};
// connectrpc.com/docs/protocol#error-codes
constexpr std::array<CodeRow, 16> kCodes = {{
    {Code::kCanceled, "canceled", 499},
    {Code::kUnknown, "unknown", 500},
    {Code::kInvalidArgument, "invalid_argument", 400},
    {Code::kDeadlineExceeded, "deadline_exceeded", 504},
    {Code::kNotFound, "not_found", 404},
    {Code::kAlreadyExists, "already_exists", 409},
    {Code::kPermissionDenied, "permission_denied", 403},
    {Code::kResourceExhausted, "resource_exhausted", 429},
    {Code::kFailedPrecondition, "failed_precondition", 400},
    {Code::kAborted, "aborted", 409},
    {Code::kOutOfRange, "out_of_range", 400},
    {Code::kUnimplemented, "unimplemented", 501},
    {Code::kInternal, "internal", 500},
    {Code::kUnavailable, "unavailable", 503},
    {Code::kDataLoss, "data_loss", 500},
    {Code::kUnauthenticated, "unauthenticated", 401},
}};

const CodeRow& RowOf(Code code) {
  for (const CodeRow& r : kCodes) {
    if (r.code == code) return r;
  }
  return kCodes[1];
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The media type without parameters, lowercased.
std::string MediaType(const http::Request& req) {
  auto it = req.find(bhttp::field::content_type);
  if (it == req.end()) return std::string();
  std::string v = Lower(std::string_view(it->value().data(), it->value().size()));
  v = v.substr(0, v.find(';'));
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  return v;
}

json ErrorJson(const RpcError& e) {
  return json{{"code", std::string(CodeName(e.code))}, {"message", e.message}};
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string_view CodeName(Code code) { return RowOf(code).name; }
unsigned HttpStatusOf(Code code) { return RowOf(code).http; }

std::string Envelope(uint8_t flags, std::string_view payload) {
  std::string out;
  out.reserve(5 + payload.size());
  const auto n = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>(flags));
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out.append(payload);
  return out;
}

std::string EndStreamEnvelope(const std::optional<RpcError>& error) {
  if (!error) return Envelope(kFlagEndStream, "{}");
  return Envelope(kFlagEndStream, Dump(json{{"error", ErrorJson(*error)}}));
}

absl::StatusOr<json> ParseStreamRequest(std::string_view body) {
  if (body.size() < 5) {
    return FieldError("body", fmt::format("a Connect stream request is one envelope (5 bytes of "
                                          "header and the message); got {} bytes",
                                          body.size()));
  }
  const auto flags = static_cast<uint8_t>(body[0]);
  const uint32_t n = (uint32_t{static_cast<uint8_t>(body[1])} << 24) |
                     (uint32_t{static_cast<uint8_t>(body[2])} << 16) |
                     (uint32_t{static_cast<uint8_t>(body[3])} << 8) |
                     uint32_t{static_cast<uint8_t>(body[4])};
  if (flags & kFlagCompressed) {
    return FieldError("body", "compressed envelopes are not accepted (Connect-Content-Encoding "
                              "identity only)");
  }
  if (flags != 0) return FieldError("body", fmt::format("envelope flags {:#x}: not a message", flags));
  if (n > kMaxRequestMessageBytes) {
    return FieldError("body", fmt::format("request message of {} bytes: at most {}", n,
                                          kMaxRequestMessageBytes));
  }
  if (body.size() - 5 != n) {
    return FieldError("body", fmt::format("the envelope says {} bytes, the body holds {} after "
                                          "it (exactly one message is expected)",
                                          n, body.size() - 5));
  }
  return ParseUnaryRequest(body.substr(5));
}

absl::StatusOr<json> ParseUnaryRequest(std::string_view body) {
  if (body.size() > kMaxRequestMessageBytes) {
    return FieldError("body", fmt::format("request message of {} bytes: at most {}", body.size(),
                                          kMaxRequestMessageBytes));
  }
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  auto j = ParseUntrustedJson(body);
  if (!j.ok()) return FieldError("body", std::string(j.status().message()));
  if (!j->is_object()) return FieldError("body", "the request message must be a JSON object");
  return j;
}

Shape ShapeOf(const http::Request& req) {
  const std::string t = MediaType(req);
  if (t == "application/json") return Shape::kUnary;
  if (t == "application/connect+json") return Shape::kStream;
  return Shape::kUnsupported;
}

http::Response UnaryReply(const http::Request& req, const json& message) {
  http::Response res{bhttp::status::ok, req.version()};
  res.set(bhttp::field::content_type, "application/json");
  res.body() = Dump(message);
  res.prepare_payload();
  return res;
}

http::Response UnaryError(const http::Request& req, const RpcError& error) {
  http::Response res{static_cast<bhttp::status>(HttpStatusOf(error.code)), req.version()};
  res.set(bhttp::field::content_type, "application/json");
  res.body() = Dump(ErrorJson(error));
  res.prepare_payload();
  return res;
}

bhttp::response_header<> StreamHeader(const http::Request& req) {
  bhttp::response_header<> h;
  h.result(bhttp::status::ok);
  h.version(req.version());
  h.set(bhttp::field::content_type, "application/connect+json");
  h.set(bhttp::field::cache_control, "no-store");
  h.set("X-Accel-Buffering", "no");
  return h;
}

std::optional<int64_t> JsonInt(const json& v) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d != static_cast<double>(static_cast<int64_t>(d)) || d > 9.2e18 || d < -9.2e18) {
      return std::nullopt;
    }
    return static_cast<int64_t>(d);
  }
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    int64_t out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
    return out;
  }
  return std::nullopt;
}

std::optional<std::string> JsonBytes(const json& v) {
  if (!v.is_string()) return std::nullopt;
  std::string s = v.get<std::string>();
  // URL-safe to standard; padding is optional for Base64Decode.
  for (char& c : s) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  return Base64Decode(s);
}

const json* Field(const json& msg, std::string_view camel, std::string_view snake) {
  if (!msg.is_object()) return nullptr;
  auto it = msg.find(camel);
  if (it == msg.end() && !snake.empty()) it = msg.find(snake);
  if (it == msg.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace sbx::api::e2b
