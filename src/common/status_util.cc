#include "common/status_util.h"

#include <cstring>

#include <fmt/format.h>

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
  return absl::Status(s.code(), fmt::format("{}: {}", context, std::string(s.message())));
}

}  // namespace sbx
