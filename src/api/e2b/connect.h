// The Connect protocol (connectrpc.com/docs/protocol) as the E2B SDKs speak it to envd: the
// JSON codec over HTTP/1.1 (e2b-compat.md §7). Unary calls are a JSON body both ways; a server
// stream is a request of one envelope and a response of envelopes, the last one the
// end-of-stream frame, which carries the error if there is one (with HTTP 200). Pure functions
// of untrusted bytes: never throw, bounded, fuzzed (tests/fuzz/e2b_connect_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http/server.h"

namespace sbx::api::e2b {

// Connect's error codes, spelled as on the wire.
enum class Code {
  kCanceled,
  kUnknown,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
  kUnauthenticated,
};
std::string_view CodeName(Code code);
// The HTTP status of a unary error with this code (the protocol's table).
unsigned HttpStatusOf(Code code);

struct RpcError {
  Code code = Code::kUnknown;
  std::string message;
};
// An sbx error as a Connect error: the mapping the SDKs' exceptions depend on (not_found →
// FileNotFoundError / `exists` false, already_exists → `makeDir` false, unavailable → the
// sandbox is gone, ...). errors.cc.
RpcError RpcErrorFor(const absl::Status& s);

// Envelope flags.
inline constexpr uint8_t kFlagCompressed = 0x01;
inline constexpr uint8_t kFlagEndStream = 0x02;
// The largest request envelope sbxd takes (a request message is small: a path, a command, a
// chunk of stdin).
inline constexpr uint32_t kMaxRequestMessageBytes = 4u << 20;

// One envelope on the wire: 1 byte of flags, 4 bytes of length (big-endian), the payload.
std::string Envelope(uint8_t flags, std::string_view payload);
// The end-of-stream envelope: `{}`, or `{"error": {"code", "message"}}`.
std::string EndStreamEnvelope(const std::optional<RpcError>& error);

// The message of a streaming request: its body must be exactly one uncompressed message
// envelope of at most kMaxRequestMessageBytes holding a JSON object. InvalidArgument naming
// what is wrong otherwise.
absl::StatusOr<nlohmann::json> ParseStreamRequest(std::string_view body);
// The message of a unary request: a JSON object (an empty body is `{}`).
absl::StatusOr<nlohmann::json> ParseUnaryRequest(std::string_view body);

// Whether the request's Content-Type is the JSON codec's for a unary call (application/json)
// or a stream (application/connect+json); charset parameters allowed. The binary codec
// (application/proto) is not served: the pinned SDKs never use it.
enum class Shape { kUnary, kStream, kUnsupported };
Shape ShapeOf(const http::Request& req);

// A unary answer: 200 with the message, or the error's status with Connect's error body.
http::Response UnaryReply(const http::Request& req, const nlohmann::json& message);
http::Response UnaryError(const http::Request& req, const RpcError& error);
// The response header of a server stream (200, application/connect+json).
http::bhttp::response_header<> StreamHeader(const http::Request& req);
// The stream's first... last frames, ready to write.
inline std::string MessageEnvelope(const nlohmann::json& message) {
  return Envelope(0, message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// proto3 JSON helpers. int64 values are written as strings (as protobuf's JSON mapping does);
// readers accept both forms, and bytes in standard or URL-safe base64, padded or not.
std::optional<int64_t> JsonInt(const nlohmann::json& v);
std::optional<std::string> JsonBytes(const nlohmann::json& v);
// A field by its lowerCamelCase or its proto (snake_case) name; nullptr when absent or null.
const nlohmann::json* Field(const nlohmann::json& msg, std::string_view camel,
                            std::string_view snake = {});

}  // namespace sbx::api::e2b
