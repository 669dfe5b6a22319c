// Errors are values. Every fallible function returns absl::Status or absl::StatusOr<T>, and
// messages name the step, the syscall and errno, e.g.
//   "mount overlay: mount(overlay -> /var/lib/sbx/...): No such device (errno 19)".
// errno is mapped to a canonical code in exactly one place (ErrnoToCode), and canonical codes
// to HTTP in exactly one place (api/status_to_http.cc).
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx {

absl::StatusCode ErrnoToCode(int err);
std::string ErrnoMessage(int err);

// ErrnoStatus(errno, fmt::format("mount overlay: mount({})", path)) ->
//   "mount overlay: mount(/x): No such device (errno 19)". Capture errno on the line after the
// syscall, before anything else can clobber it.
//
// Note: Debian's abseil has its own absl::string_view (not std::string_view), so absl::StrCat
// does not take std::string_view: build messages with fmt::format or std::string.
absl::Status ErrnoStatus(int err, std::string_view what);

// Adds context in front of an error message, keeping its code.
absl::Status Annotate(const absl::Status& s, std::string_view context);

}  // namespace sbx

#define SBX_STATUS_CONCAT_INNER_(a, b) a##b
#define SBX_STATUS_CONCAT_(a, b) SBX_STATUS_CONCAT_INNER_(a, b)

#define SBX_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::absl::Status sbx_status_ = (expr);          \
    if (!sbx_status_.ok()) return sbx_status_;    \
  } while (0)

#define SBX_ASSIGN_OR_RETURN(lhs, expr) \
  SBX_ASSIGN_OR_RETURN_IMPL_(SBX_STATUS_CONCAT_(sbx_statusor_, __LINE__), lhs, expr)

#define SBX_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

namespace sbx {

// An error carrying an API error code ("sandbox_not_running") and, when a request field is at
// fault, its dotted path ("resources.vcpu"). The HTTP status is still chosen from the canonical
// code, in api/status_to_http.cc only.
absl::Status ApiError(absl::StatusCode code, std::string_view api_code, std::string_view message,
                      std::string_view field = {});
// Shorthand for the most common case: 400 invalid_argument naming the field.
absl::Status FieldError(std::string_view field, std::string_view message);
std::string ApiErrorCode(const absl::Status& s);   // "" when none was attached
std::string ApiErrorField(const absl::Status& s);  // "" when none was attached
std::string ApiErrorDetail(const absl::Status& s, std::string_view key);  // extra details

// Attaches an extra detail (e.g. "operation_id") to an error; shown under error.details.
absl::Status WithDetail(absl::Status s, std::string_view key, std::string_view value);

}  // namespace sbx
