#include "api/e2b/connect.h"

#include <gtest/gtest.h>

#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

using nlohmann::json;

TEST(ConnectEnvelope, HeaderIsFlagsThenBigEndianLength) {
  const std::string e = Envelope(0, R"({"event":{"start":{"pid":42}}})");
  ASSERT_EQ(e.size(), 5u + 30u);
  EXPECT_EQ(e[0], '\0');
  EXPECT_EQ(static_cast<uint8_t>(e[4]), 30);
  EXPECT_EQ(e.substr(5), R"({"event":{"start":{"pid":42}}})");
  const std::string big = Envelope(0, std::string(0x010203, 'x'));
  EXPECT_EQ(static_cast<uint8_t>(big[1]), 0);
  EXPECT_EQ(static_cast<uint8_t>(big[2]), 1);
  EXPECT_EQ(static_cast<uint8_t>(big[3]), 2);
  EXPECT_EQ(static_cast<uint8_t>(big[4]), 3);
}

TEST(ConnectEnvelope, EndStreamCarriesTheError) {
  EXPECT_EQ(EndStreamEnvelope(std::nullopt), std::string("\x02\0\0\0\x02{}", 7));
  const std::string e = EndStreamEnvelope(RpcError{Code::kDeadlineExceeded, "too slow"});
  EXPECT_EQ(e[0], '\x02');
  EXPECT_EQ(json::parse(e.substr(5)),
            json::parse(R"({"error":{"code":"deadline_exceeded","message":"too slow"}})"));
}

TEST(ConnectStreamRequest, ExactlyOneUncompressedMessage) {
  const std::string msg = R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false})";
  auto ok = ParseStreamRequest(Envelope(0, msg));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["process"]["cmd"], "/bin/bash");
  EXPECT_FALSE(ParseStreamRequest(Envelope(kFlagCompressed, msg)).ok());
  EXPECT_FALSE(ParseStreamRequest(Envelope(kFlagEndStream, msg)).ok());
  EXPECT_FALSE(ParseStreamRequest(Envelope(0, msg) + Envelope(0, msg)).ok());
  EXPECT_FALSE(ParseStreamRequest(Envelope(0, msg).substr(0, 20)).ok());
  EXPECT_FALSE(ParseStreamRequest("").ok());
  EXPECT_FALSE(ParseStreamRequest(Envelope(0, "[1]")).ok());
  EXPECT_FALSE(ParseStreamRequest(Envelope(0, "{")).ok());
  // A header claiming more than the cap is refused before anything is read.
  std::string huge("\0\x7f\xff\xff\xff", 5);
  auto s = ParseStreamRequest(huge);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(ApiErrorField(s.status()), "body");
}

TEST(ConnectUnaryRequest, EmptyBodyIsTheEmptyMessage) {
  auto e = ParseUnaryRequest("");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, json::object());
  EXPECT_FALSE(ParseUnaryRequest("null").ok());
  EXPECT_FALSE(ParseUnaryRequest(std::string(100000, '[')).ok());
}

TEST(ConnectCodes, NamesAndStatusesFollowTheProtocol) {
  EXPECT_EQ(CodeName(Code::kNotFound), "not_found");
  EXPECT_EQ(HttpStatusOf(Code::kNotFound), 404u);
  EXPECT_EQ(HttpStatusOf(Code::kCanceled), 499u);
  EXPECT_EQ(HttpStatusOf(Code::kUnauthenticated), 401u);
  EXPECT_EQ(HttpStatusOf(Code::kAlreadyExists), 409u);
}

TEST(ConnectCodes, SbxErrorsMapToWhatTheSdksRead) {
  EXPECT_EQ(RpcErrorFor(ApiError(absl::StatusCode::kNotFound, "not_found", "x")).code,
            Code::kNotFound);
  EXPECT_EQ(RpcErrorFor(ApiError(absl::StatusCode::kAlreadyExists, "already_exists", "x")).code,
            Code::kAlreadyExists);
  EXPECT_EQ(
      RpcErrorFor(ApiError(absl::StatusCode::kFailedPrecondition, "sandbox_not_running", "x")).code,
      Code::kUnavailable);
  EXPECT_EQ(RpcErrorFor(ApiError(absl::StatusCode::kFailedPrecondition, "not_a_directory", "x")).code,
            Code::kInvalidArgument);
  EXPECT_EQ(RpcErrorFor(absl::DeadlineExceededError("x")).code, Code::kDeadlineExceeded);
}

TEST(ProtoJson, IntsAsNumbersOrStringsBytesInEitherBase64) {
  EXPECT_EQ(JsonInt(json(7)), 7);
  EXPECT_EQ(JsonInt(json("7")), 7);
  EXPECT_EQ(JsonInt(json("-3")), -3);
  EXPECT_FALSE(JsonInt(json("7x")).has_value());
  EXPECT_FALSE(JsonInt(json("")).has_value());
  EXPECT_FALSE(JsonInt(json(1.5)).has_value());
  EXPECT_FALSE(JsonInt(json(true)).has_value());
  EXPECT_EQ(JsonBytes(json("aGk=")), "hi");
  EXPECT_EQ(JsonBytes(json("aGk")), "hi");
  EXPECT_EQ(JsonBytes(json("-_8")), std::string("\xfb\xff"));
  EXPECT_FALSE(JsonBytes(json("!!")).has_value());
  EXPECT_FALSE(JsonBytes(json(3)).has_value());
  const json m = {{"exit_code", 3}, {"modifiedTime", nullptr}};
  ASSERT_NE(Field(m, "exitCode", "exit_code"), nullptr);
  EXPECT_EQ(*Field(m, "exitCode", "exit_code"), 3);
  EXPECT_EQ(Field(m, "modifiedTime"), nullptr);
  EXPECT_EQ(Field(json(3), "x"), nullptr);
}

TEST(ConnectShape, ByContentTypeWithParameters) {
  http::Request req;
  req.set(http::bhttp::field::content_type, "application/json");
  EXPECT_EQ(ShapeOf(req), Shape::kUnary);
  req.set(http::bhttp::field::content_type, "Application/Connect+JSON; charset=utf-8");
  EXPECT_EQ(ShapeOf(req), Shape::kStream);
  req.set(http::bhttp::field::content_type, "application/proto");
  EXPECT_EQ(ShapeOf(req), Shape::kUnsupported);
  http::Request none;
  EXPECT_EQ(ShapeOf(none), Shape::kUnsupported);
}

}  // namespace
}  // namespace sbx::api::e2b
