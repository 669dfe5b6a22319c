#include "common/status_util.h"

#include <cstring>

#include <fmt/format.h>

#include "absl/strings/cord.h"

namespace sbx {

absl::StatusCode ErrnoToCode(int err) {
  switch (err) {
    case 0:
      return absl::StatusCode::kOk;
    case ENOENT:
    case ESRCH:
      return absl::StatusCode::kNotFound;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case EPERM:
    case EACCES:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    case EBUSY:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return absl::StatusCode::kUnavailable;
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
      return absl::StatusCode::kInvalidArgument;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string ErrnoMessage(int err) {
  char buf[128];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return fmt::format("{} (errno {})", msg, err);
}

absl::Status ErrnoStatus(int err, std::string_view what) {
  return absl::Status(ErrnoToCode(err), fmt::format("{}: {}", what, ErrnoMessage(err)));
}

absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  absl::Status out(s.code(), fmt::format("{}: {}", context, std::string(s.message())));
  // The API code, field and details ride along: context must not turn a 502 into a 500.
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

}  // namespace sbx

namespace sbx {
namespace {
constexpr char kCodeKey[] = "sbx.code";
constexpr char kFieldKey[] = "sbx.field";
std::string DetailKey(std::string_view key) { return fmt::format("sbx.detail.{}", key); }
}  // namespace

absl::Status ApiError(absl::StatusCode code, std::string_view api_code, std::string_view message,
                      std::string_view field) {
  absl::Status s(code, std::string(message));
  s.SetPayload(kCodeKey, absl::Cord(std::string(api_code)));
  if (!field.empty()) s.SetPayload(kFieldKey, absl::Cord(std::string(field)));
  return s;
}

absl::Status FieldError(std::string_view field, std::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                  fmt::format("{}: {}", field, message), field);
}

std::string ApiErrorCode(const absl::Status& s) {
  auto p = s.GetPayload(kCodeKey);
  return p ? std::string(*p) : std::string();
}

std::string ApiErrorField(const absl::Status& s) {
  auto p = s.GetPayload(kFieldKey);
  return p ? std::string(*p) : std::string();
}

std::string ApiErrorDetail(const absl::Status& s, std::string_view key) {
  auto p = s.GetPayload(DetailKey(key));
  return p ? std::string(*p) : std::string();
}

absl::Status WithDetail(absl::Status s, std::string_view key, std::string_view value) {
  s.SetPayload(DetailKey(key), absl::Cord(std::string(value)));
  return s;
}

}  // namespace sbx
