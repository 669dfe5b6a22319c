#include "service/template_ref.h"

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::service {
namespace {

absl::Status Bad(const char* field, std::string message) {
  return ApiError(absl::StatusCode::kInvalidArgument, "invalid_template_ref", std::move(message),
                  field);
}

bool Lower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

std::string TemplateRef::String() const {
  return digest.empty() ? name + ":" + tag : name + "@" + digest;
}

bool IsSha256Digest(std::string_view d) {
  constexpr std::string_view kPrefix = "sha256:";
  if (d.size() != kPrefix.size() + 64 || d.substr(0, kPrefix.size()) != kPrefix) return false;
  for (char c : d.substr(kPrefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status CheckTemplateName(std::string_view name, const char* field) {
  if (name.empty() || name.size() > 128) {
    return Bad(field, fmt::format("template name must be 1 to 128 bytes (got {})", name.size()));
  }
  // One path segment (GET /v1/templates/{name}), so no '/': it starts and ends with a
  // lowercase letter or digit.
  if (!Lower(name.front()) || !Lower(name.back())) {
    return Bad(field, fmt::format("template name \"{}\" must start and end with a lowercase "
                                  "letter or digit",
                                  name));
  }
  for (char c : name) {
    if (!Lower(c) && c != '.' && c != '_' && c != '-') {
      return Bad(field, fmt::format("template name \"{}\" may hold only lowercase letters, "
                                    "digits, '.', '_' and '-'",
                                    name));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTemplateTag(std::string_view tag, const char* field) {
  if (tag.empty() || tag.size() > 128) {
    return Bad(field, fmt::format("template tag must be 1 to 128 bytes (got {})", tag.size()));
  }
  if (tag.front() == '.' || tag.front() == '-') {
    return Bad(field, fmt::format("template tag \"{}\" may not start with '.' or '-'", tag));
  }
  for (char c : tag) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) {
      return Bad(field, fmt::format("template tag \"{}\" may hold only letters, digits, '_', '.' "
                                    "and '-'",
                                    tag));
    }
  }
  return absl::OkStatus();
}

std::string QualifiedTemplateName(std::string_view ns, std::string_view name) {
  if (ns.empty()) return std::string(name);
  return fmt::format("{}/{}", ns, name);
}

SplitName SplitTemplateName(std::string_view stored) {
  const size_t slash = stored.find('/');
  if (slash == std::string_view::npos) return {"", std::string(stored)};
  return {std::string(stored.substr(0, slash)), std::string(stored.substr(slash + 1))};
}

absl::StatusOr<TemplateRef> ParseTemplateRef(std::string_view text, const char* field) {
  TemplateRef ref;
  if (const size_t at = text.find('@'); at != std::string_view::npos) {
    ref.name = std::string(text.substr(0, at));
    ref.digest = std::string(text.substr(at + 1));
    if (!IsSha256Digest(ref.digest)) {
      return Bad(field, fmt::format("template reference \"{}\": a digest is sha256: and 64 "
                                    "lowercase hex digits",
                                    text));
    }
  } else if (const size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    ref.name = std::string(text.substr(0, colon));
    ref.tag = std::string(text.substr(colon + 1));
    SBX_RETURN_IF_ERROR(CheckTemplateTag(ref.tag, field));
  } else {
    ref.name = std::string(text);
    ref.tag = "latest";
  }
  SBX_RETURN_IF_ERROR(CheckTemplateName(ref.name, field));
  return ref;
}

}  // namespace sbx::service
